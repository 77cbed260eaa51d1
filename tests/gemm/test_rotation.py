"""Rotations of every GEMM's operands (fp8jax/gemm/rotation.py) and the recipes that use
them: Quartet II (nvfp4_quartet2*: MS-EDEN backward behind 128-point rotations with signs
drawn per step, operands re-quantized from the forward's) and UFP4 (ufp4*: uniform grids,
the RHT on all three GEMMs)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import grouped, recipes, rotation
from tests.references import reference_ms_eden as ref

DN = (((2,), (0,)), ((), ()))
NEW = ("nvfp4_quartet2", "nvfp4_quartet2_rtn", "nvfp4_quartet2_sr", "ufp4", "ufp4_int4",
       "ufp4_e2m1")


def test_step_signs_keep_each_product_and_change_with_the_source():
  """A pair rotated with one draw keeps its product (float32 sums against float64); the
  draw is a function of the source tensor: the same source, the same signs."""
  cfg = recipes.recipe("nvfp4_quartet2")
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((5, 200)), jnp.float32)  # 200: padded to 256
  b = jnp.asarray(rng.standard_normal((7, 200)), jnp.float32)
  ar, br = rotation.pair(a, b, cfg, a)
  assert ar.shape == (5, 256)
  got = np.asarray(jnp.einsum("mk,nk->mn", ar, br, precision="highest"), np.float64)
  want = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
  np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max())
  s1, s2, s3 = (np.asarray(rotation.signs(cfg, v)) for v in (a, a, b))
  assert set(np.unique(s1)) == {-1.0, 1.0} and (s1 == s2).all() and (s1 != s3).any()
  # the rotation is diag(s) H / sqrt(128) on each run of 128 elements
  h = ref.hadamard(128)
  want_a = (np.pad(np.asarray(a, np.float64), [(0, 0), (0, 56)]).reshape(5, 2, 128)
            * s1) @ h
  np.testing.assert_allclose(np.asarray(ar).reshape(5, 2, 128), want_a, atol=1e-5)


def test_config_validation():
  with pytest.raises(ValueError, match="rht_gemms"):
    fp8jax.GemmConfig(wgrad_hadamard=16, rht_gemms="fprop")
  with pytest.raises(ValueError, match="backward_from_forward"):
    fp8jax.GemmConfig(wgrad_hadamard=16, backward_from_forward=True)
  with pytest.raises(ValueError, match="2-D"):
    recipes.recipe("ufp4").replace(roles=recipes.recipe("nvfp4_recipe").roles)
  assert "step" in recipes.recipe("nvfp4_quartet2").describe()


def _grads(cfg, x, w):
  def loss(x, w):
    return jnp.sum(fp8jax.fp8_dot_general(x, w, DN, config=cfg) ** 2)
  return jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW)
def test_recipe_gradients_near_bf16_dense_and_grouped(name):
  """Dense: finite gradients within 35% of the unquantized ones (4-bit operands); the
  grouped GEMM (an empty expert, groups padded to the 128-row rotation): finite."""
  x = jax.random.normal(jax.random.key(0), (2, 64, 128))
  w = jax.random.normal(jax.random.key(1), (128, 96)) * 0.1
  cfg = recipes.recipe(name)
  ref_g = _grads(fp8jax.GemmConfig(fprop="bf16", dgrad="bf16", wgrad="bf16"), x, w)
  g = _grads(cfg, x, w)
  for got, want in zip(g, ref_g):
    assert bool(jnp.all(jnp.isfinite(got))), name
    assert float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want)) < 0.35, name
  sizes = jnp.array([40, 0, 88], jnp.int32)
  we = jax.random.normal(jax.random.key(3), (3, 128, 96)) * 0.1
  gg = jax.jit(jax.grad(lambda x, w: jnp.sum(grouped.fp8_ragged_dot(x, w, sizes, cfg) ** 2),
                        argnums=(0, 1)))(x.reshape(128, 128), we)
  assert all(bool(jnp.all(jnp.isfinite(v))) for v in gg), name
