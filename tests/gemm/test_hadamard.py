"""The random Hadamard transform against a NumPy float64 reference: Transformer Engine's
fixed signs and BF16 precision by default, seeded random signs and float32 on request.

The reference builds the Sylvester matrix from its closed form ``H[i, j] = (-1)**popcount(i
& j)``, multiplies each block of the data by the signs elementwise and then by ``H / 4``,
in float64, and rounds with ml_dtypes."""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import dense, hadamard, recipes

# NVIDIA/TransformerEngine, transformer_engine/jax/quantize/hadamard.py and
# transformer_engine/pytorch/custom_recipes/reference_nvfp4.py (get_wgrad_sign_vector).
TE_VECTOR = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]
TOKENS = 40  # not a multiple of 16: the last block is zero-padded


def _sylvester(n):
  i = np.arange(n)
  parity = np.vectorize(lambda v: bin(v).count("1") % 2)(i[:, None] & i[None, :])
  return np.where(parity == 0, 1.0, -1.0)


def _reference(x, signs, dtype):
  """float64 [rows, T_pad]: each 16-run of x (bf16-rounded for "bfloat16") times the
  signs, then times H_16 / 4; the result bf16-rounded for "bfloat16"."""
  x = np.asarray(x, np.float64)
  if dtype == "bfloat16":
    x = x.astype(ml_dtypes.bfloat16).astype(np.float64)
  t_pad = -(-x.shape[-1] // 16) * 16
  x = np.pad(x, [(0, 0), (0, t_pad - x.shape[-1])])
  blocks = x.reshape(x.shape[0], -1, 16) * np.asarray(signs, np.float64)
  out = (blocks @ (_sylvester(16) / 4.0)).reshape(x.shape[0], t_pad)
  if dtype == "bfloat16":
    out = out.astype(ml_dtypes.bfloat16).astype(np.float64)
  return out


_rht = jax.jit(hadamard.random_hadamard, static_argnames=("size", "signs", "seed", "dtype"))


def test_te_signs_and_matrix():
  assert list(hadamard.TE_SIGNS) == TE_VECTOR
  want = np.diag(np.asarray(TE_VECTOR, np.float64)) @ _sylvester(16) / 4.0  # rows flipped
  q = hadamard.hadamard_matrix(16)
  assert q.dtype == np.float32
  np.testing.assert_array_equal(q.astype(np.float64), want)
  np.testing.assert_array_equal(q.astype(ml_dtypes.bfloat16).astype(np.float64), want)
  np.testing.assert_array_equal(hadamard.hadamard_matrix(16, "none").astype(np.float64),
                                _sylvester(16) / 4.0)


def test_random_signs_are_the_seeded_draw():
  """The previous behaviour, kept as an option: signs from numpy's default_rng(seed)."""
  for seed in (0, 5):
    s = np.random.default_rng(seed).choice([-1.0, 1.0], size=16)
    np.testing.assert_array_equal(hadamard.hadamard_matrix(16, "random", seed).astype(np.float64),
                                  np.diag(s) @ _sylvester(16) / 4.0)
  np.testing.assert_array_equal(hadamard.hadamard_matrix(16, "random", None),
                                hadamard.hadamard_matrix(16, "none"))


@given(scale=st.floats(2.0**-20, 2.0**20), seed=st.integers(0, 2**31 - 1))
def test_te_transform_in_bfloat16_is_exact_on_a_coarse_grid(scale, seed):
  """Inputs k * 2**-6 * 2**e (|k| <= 255, a power of two per call): bf16 values whose
  products with ±1/4 and 16-term sums are exact in float32, so the transform equals the
  float64 reference rounded to bf16 bit for bit."""
  rng = np.random.default_rng(seed)
  pow2 = np.float32(2.0 ** np.round(np.log2(scale)))
  x = (rng.integers(-255, 256, (3, TOKENS)) * np.float32(2.0**-6) * pow2).astype(np.float32)
  got = np.asarray(_rht(jnp.asarray(x)), np.float64)
  assert got.shape == (3, 48)
  np.testing.assert_array_equal(got, _reference(x, TE_VECTOR, "bfloat16"))


@given(seed=st.integers(0, 2**31 - 1), log_scale=st.integers(-30, 30))
def test_te_transform_in_bfloat16_rounds_the_exact_sums(seed, log_scale):
  """Gaussian inputs: every output is a bf16 neighbour of the float64 value of the
  bf16-rounded inputs' transform, and nearly all are its nearest (the sums are float32,
  not exact, in between)."""
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((4, TOKENS)) * 2.0**log_scale).astype(np.float32)
  got = np.asarray(_rht(jnp.asarray(x)), np.float64)
  xb = x.astype(ml_dtypes.bfloat16).astype(np.float64)
  exact = _reference(xb, TE_VECTOR, "float32")  # bf16 inputs, unrounded float64 sums
  nearest = exact.astype(ml_dtypes.bfloat16).astype(np.float64)
  tiny = np.abs(exact) < 2.0**-100  # (an exact zero is its own neighbour)
  ulp = 2.0 ** (np.floor(np.log2(np.where(tiny, 1.0, np.abs(exact)))) - 7)  # bf16 spacing
  down, up = np.floor(exact / ulp) * ulp, np.ceil(exact / ulp) * ulp
  assert np.all((got == down) | (got == up))
  assert np.mean(got == nearest) >= 0.97


@given(seed=st.integers(0, 2**31 - 1))
def test_float32_and_random_options_against_reference(seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((3, TOKENS)).astype(np.float32)
  signs = np.random.default_rng(7).choice([-1.0, 1.0], size=16)
  for kind, s in (("te", TE_VECTOR), ("random", signs), ("none", np.ones(16))):
    got = np.asarray(_rht(jnp.asarray(x), signs=kind, seed=7, dtype="float32"), np.float64)
    np.testing.assert_allclose(got, _reference(x, s, "float32"), rtol=0, atol=1e-6)


def test_signs_multiply_the_data_before_the_hadamard_matrix():
  """diag(s) H, applied as x @ (diag(s) H): the signs flip the input elements (TE's
  order), which is not H diag(s) (flipping the outputs)."""
  x = np.zeros((1, 16), np.float32)
  x[0, 3] = 1.0  # s[3] = -1: the output is -(row 3 of H) / 4
  got = np.asarray(_rht(jnp.asarray(x)), np.float64)[0]
  np.testing.assert_array_equal(got, -_sylvester(16)[3] / 4.0)
  cols = (x.astype(np.float64) @ _sylvester(16) / 4.0)[0] * np.asarray(TE_VECTOR)
  assert not np.array_equal(got, cols)


def test_transform_is_orthogonal_in_float32():
  """(X^T Q)(Q^T dY) = X^T dY with TE's signs in float32: equal to float32 rounding; in
  bfloat16 the transform itself rounds (what the recipe quantizes is that)."""
  rng = np.random.default_rng(3)
  xt = rng.standard_normal((24, 70)).astype(np.float32)
  dyt = rng.standard_normal((20, 70)).astype(np.float32)
  want = dyt.astype(np.float64) @ xt.astype(np.float64).T
  for dtype, tol in (("float32", 2e-5), ("bfloat16", 2e-2)):
    a, b = (_rht(jnp.asarray(v), dtype=dtype) for v in (xt, dyt))
    got = np.asarray(jnp.einsum("kt,nt->nk", a, b, precision="highest"), np.float64)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < tol, (dtype, err)
    assert dtype == "float32" or err > 1e-4  # bf16 rounding is visible


def test_configs_default_to_te_and_keep_the_old_option():
  cfg = recipes.recipe("nvfp4_recipe")
  assert (cfg.wgrad_hadamard, cfg.rht_signs, cfg.rht_dtype) == (16, "te", "bfloat16")
  assert (fp8jax.GemmConfig().rht_signs, fp8jax.GemmConfig().rht_dtype) == ("te", "bfloat16")
  x = jnp.asarray(np.random.default_rng(4).standard_normal((5, TOKENS)), jnp.float32)
  np.testing.assert_array_equal(np.asarray(dense.wgrad_transform(x, cfg)),
                                _reference(np.asarray(x), TE_VECTOR, "bfloat16"))
  old = cfg.replace(rht_signs="random", rht_dtype="float32", hadamard_seed=2)
  assert old.describe().endswith("rht=16/random/float32")
  signs = np.random.default_rng(2).choice([-1.0, 1.0], size=16)
  np.testing.assert_allclose(np.asarray(dense.wgrad_transform(x, old), np.float64),
                             _reference(np.asarray(x), signs, "float32"), atol=1e-6)


def test_ideal_recipe_differs_from_the_recipe_in_its_transform_and_rounding_only():
  new, ideal = recipes.recipe("nvfp4_recipe"), recipes.recipe("nvfp4_recipe_ideal")
  assert (ideal.rht_signs, ideal.rht_dtype, ideal.roles.grad.sr_bits) == (
      "random", "float32", 24)
  assert (new.rht_signs, new.rht_dtype, new.roles.grad.sr_bits) == ("te", "bfloat16", 8)
  back = ideal.replace(rht_signs="te", rht_dtype="bfloat16", roles=dataclasses.replace(
      ideal.roles, grad=ideal.roles.grad.replace(sr_bits=8)))
  assert back == new
  assert recipes.BF16_TAIL["nvfp4_recipe_ideal"] == recipes.BF16_TAIL["nvfp4_recipe"]


def test_config_validation():
  with pytest.raises(ValueError, match="size 16"):
    fp8jax.GemmConfig(wgrad_hadamard=32)
  fp8jax.GemmConfig(wgrad_hadamard=32, rht_signs="random")
  with pytest.raises(ValueError, match="unknown Hadamard signs"):
    fp8jax.GemmConfig(rht_signs="fixed")
  with pytest.raises(ValueError, match="unknown Hadamard dtype"):
    fp8jax.GemmConfig(wgrad_hadamard=16, rht_dtype="float16")
  with pytest.raises(ValueError, match="size 16"):
    hadamard.hadamard_matrix(8)
