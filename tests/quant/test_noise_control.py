"""The noise-matched control of a quantization (fp8jax.quant.noise_control).

The error energies per block are checked with NumPy float64 sums over explicit blocks
(written here, apart from the code under test) of the format's own round trip, which is
itself checked against ml_dtypes in the format tests.
"""

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.models import policy as policy_lib

SPECS = {
    "deepseek_v3": fp8jax.preset("deepseek_v3").replace(backward=None),
    "e5m2_tensor": fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.per_tensor()),
    "mxfp4": fp8jax.preset("mxfp4").replace(backward=None),
    "nvfp4": fp8jax.preset("nvfp4").replace(backward=None),
    "w128x128": fp8jax.QuantSpec(granularity=fp8jax.block((128, 128))),
}


def block_energy(d: np.ndarray, block: tuple[int, int]) -> np.ndarray:
  """Sum of d**2 over every (block[0] x block[1]) block, float64, by explicit loops."""
  rows, cols = d.shape
  br, bc = min(block[0], rows), min(block[1], cols)
  out = np.zeros((-(-rows // br), -(-cols // bc)))
  for i in range(out.shape[0]):
    for j in range(out.shape[1]):
      out[i, j] = np.sum(np.square(d[i * br:(i + 1) * br, j * bc:(j + 1) * bc],
                                   dtype=np.float64))
  return out


def heavy_tailed(key, shape):
  k1, k2 = jax.random.split(key)
  return jax.random.normal(k1, shape) * jnp.exp(2 * jax.random.normal(k2, shape))


@pytest.mark.slow
@hypothesis.settings(deadline=None, max_examples=8)
@hypothesis.given(name=st.sampled_from(sorted(SPECS)), rows=st.integers(1, 130),
                  cols=st.sampled_from([16, 48, 128, 200, 256]), seed=st.integers(0, 2**16),
                  zeros=st.integers(0, 40))
@hypothesis.example(name="deepseek_v3", rows=1, cols=16, seed=0, zeros=15)  # one nonzero
@hypothesis.example(name="deepseek_v3", rows=16, cols=16, seed=0, zeros=0)  # 2.4e-5 energy
@hypothesis.example(name="deepseek_v3", rows=86, cols=16, seed=721, zeros=0)  # |x| = 3289
def test_control_keeps_the_error_energy_of_every_block(name, rows, cols, seed, zeros):
  spec = SPECS[name]
  x = heavy_tailed(jax.random.key(seed), (rows, cols))
  x = x.at[0, :zeros].set(0.0)
  x_hat = np.asarray(fp8jax.quantize_dequantize(x, spec), np.float64)
  x_ctl = np.asarray(fp8jax.quantize_dequantize(x, spec.replace(noise_control=True)),
                     np.float64)
  xn = np.asarray(x, np.float64)
  block = spec.granularity.block_shape(x.shape)
  want, got = block_energy(x_hat - xn, block), block_energy(x_ctl - xn, block)
  # The control matches each block's energy in float32 (sums of squares over heavy-tailed
  # values): 1e-4 relative. Its output x + noise is then rounded to float32, which moves
  # each element by up to half an ulp r_i: |sum (d + r)^2 - sum d^2| <= 2 |d| |r| + |r|^2.
  # That term matters where a block holds a large |x| beside a small error.
  half_ulp = np.spacing(np.maximum(np.abs(xn), np.abs(x_ctl)).astype(np.float32)) / 2
  r = np.sqrt(block_energy(half_ulp.astype(np.float64), block))
  bound = 1e-4 * want + 2 * np.sqrt(want) * r + np.square(r) + 1e-30
  assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
  assert np.all(x_ctl[xn == 0] == 0)  # zeros quantize exactly: the control keeps them
  # Not the quantization's own error but noise in another direction, wherever a block has
  # error energy spread over two or more nonzero elements (with one, the noise is +-the
  # error itself, and may equal it).
  nonzeros = block_energy((xn != 0).astype(np.float64), block)
  if np.any((want > 0) & (nonzeros >= 2)):
    assert not np.allclose(x_ctl - xn, x_hat - xn, rtol=1e-3, atol=0)


@pytest.mark.slow
def test_control_noise_is_unbiased_and_uncorrelated_with_the_input():
  """Over many draws (explicit keys through matched_noise) the noise averages to zero
  element by element, while the E5M2 round trip's error does not (it is a function of x)."""
  from fp8jax.quant import noise_control
  spec = SPECS["e5m2_tensor"]
  x = heavy_tailed(jax.random.key(0), (4, 64))
  x_hat = fp8jax.quantize_dequantize(x, spec)
  draws = jax.vmap(lambda k: noise_control.matched_noise(x, x_hat, (4, 64), k) - x)(
      jax.random.split(jax.random.key(1), 4000))
  scale = float(jnp.sqrt(jnp.mean(jnp.square(x_hat - x))))
  mean = np.asarray(jnp.mean(draws, axis=0))
  # Each mean is N(0, sigma^2 / 4000) with sigma ~ scale: 6 sigma over 256 elements.
  assert np.max(np.abs(mean)) < 6 * scale / np.sqrt(4000) * 1.2
  assert np.max(np.abs(np.asarray(x_hat - x))) > 10 * np.max(np.abs(mean))


@pytest.mark.slow
def test_control_is_a_function_of_the_tensor_and_keeps_non_finite_values():
  spec = SPECS["deepseek_v3"].replace(noise_control=True)
  x = heavy_tailed(jax.random.key(3), (2, 256)).at[1, 5].set(jnp.nan).at[0, 7].set(jnp.inf)
  a, b = fp8jax.quantize_dequantize(x, spec), fp8jax.quantize_dequantize(x, spec)
  np.testing.assert_array_equal(a, b)
  real = fp8jax.quantize_dequantize(x, spec.replace(noise_control=False))
  # A block holding NaN or inf dequantizes to NaN as a whole, under its control too.
  assert bool(jnp.all(jnp.isnan(a[1, :128]))) and bool(jnp.all(jnp.isnan(a[0, :128])))
  np.testing.assert_array_equal(jnp.isnan(a), jnp.isnan(real))
  other = fp8jax.quantize_dequantize(x.at[0, 0].add(1.0), spec)
  assert not np.allclose(other[1, 100:], a[1, 100:])  # a new tensor, new draws


@pytest.mark.slow
def test_fake_quant_control_backward_is_the_cotangent_spec_control():
  spec = fp8jax.QuantSpec(format="e4m3", backward=fp8jax.QuantSpec(format="e5m2"))
  ctl = policy_lib.noise_spec(spec, True)  # the forward and the cotangent spec
  x = heavy_tailed(jax.random.key(4), (8, 128))
  g = heavy_tailed(jax.random.key(5), (8, 128))
  _, vjp = jax.vjp(lambda v: fp8jax.fake_quant(v, ctl), x)
  np.testing.assert_array_equal(vjp(g)[0], fp8jax.quantize_dequantize(g, ctl.backward))
  want = block_energy(np.asarray(fp8jax.quantize_dequantize(g, spec.backward) - g), (1, 128))
  got = block_energy(np.asarray(vjp(g)[0] - g, np.float64), (1, 128))
  np.testing.assert_allclose(got, want, rtol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["fp32_blockwise", "nvfp4_recipe"])
def test_gemm_control_multiplies_the_controlled_operands(recipe):
  """The forward GEMM of a controlled recipe is the float32 product of the operands'
  controls (each with its role's blocks: 1x128 / 1x16 along K for X, blocks of W^T)."""
  cfg = policy_lib.noise_policy(policy_lib.parse_policy(f"gemm:{recipe}")).gemm
  x = heavy_tailed(jax.random.key(6), (64, 256))
  w = heavy_tailed(jax.random.key(7), (256, 96)) * 0.05
  y = jax.jit(lambda a, b: fp8jax.fp8_dot_general(a, b, (((1,), (0,)), ((), ())),
                                                   config=cfg))(x, w)
  xc = jax.jit(fp8jax.quantize_dequantize, static_argnums=1)(x, cfg.roles.input)
  wc = jax.jit(fp8jax.quantize_dequantize, static_argnums=1)(w.T, cfg.roles.weight).T
  want = np.asarray(xc, np.float64) @ np.asarray(wc, np.float64)
  np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=1e-4,
                             atol=1e-5 * np.abs(want).max())
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  assert np.abs(np.asarray(y) - exact).max() > 0  # the control does perturb


def test_noise_policy_expressions_and_errors():
  pol = policy_lib.parse_policy("noise(attn@0:e4m3+gemm:fp32_blockwise)")
  assert pol.name == "noise(attn@0:e4m3+gemm:fp32_blockwise)"
  assert policy_lib.is_noise_control(pol)
  assert all(r.spec.noise_control for r in pol.rules)
  assert pol.gemm.roles.grad.noise_control and pol.gemm.roles.weight.noise_control
  base = policy_lib.control_base(pol)
  assert base == policy_lib.parse_policy("attn@0:e4m3+gemm:fp32_blockwise")
  with pytest.raises(ValueError, match="quantizes nothing"):
    policy_lib.parse_policy("noise(bf16)")
  with pytest.raises(ValueError, match="already a noise-matched control"):
    policy_lib.parse_policy("noise(noise(attn@0:e4m3))")
  with pytest.raises(ValueError, match="not a noise-matched control"):
    policy_lib.control_base(base)
  with pytest.raises(TypeError, match="noise_control must be a bool"):
    fp8jax.QuantSpec(noise_control=1)
