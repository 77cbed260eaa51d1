"""An overflow is never hidden by quantization: a block holding ±inf (or NaN) comes back
NaN as a whole, from fake_quant, quantize_dequantize and the GEMM simulation, in E4M3,
E5M2, MXFP8 and NVFP4; the other blocks are quantized as if it were not there."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.quant import fused_round_trip

SPECS = {
    "e4m3": fp8jax.preset("deepseek_v3"),
    "e5m2": fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.tile(128)),
    "mxfp8": fp8jax.preset("mxfp8"),
    "nvfp4": fp8jax.preset("nvfp4"),
}
RECIPES = {"e4m3": "fp32_blockwise", "mxfp8": "mxfp8", "nvfp4": "nvfp4"}


def _inputs():
  """[4, 256]: row 0 holds one inf in its first block, row 1 a first block of ±inf only,
  rows 2 and 3 are finite (row 3 repeats row 0 without the inf)."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((4, 256)).astype(np.float32)
  x[3] = x[0]
  x[0, 3] = np.inf
  x[1, :16] = np.inf
  x[1, 8:16] = -np.inf
  return x


def _zeroed(x, b):
  """``x`` with the non-finite first blocks of rows 0 and 1 set to zero."""
  x = x.copy()
  x[:2, :b] = 0.0
  return x


def _block(name):
  return SPECS[name].granularity.sizes[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("path", ["fake_quant", "quantize_dequantize", "fused"])
def test_inf_block_comes_back_nan(name, path):
  spec = SPECS[name]
  x = _inputs()
  fn = {"fake_quant": fp8jax.fake_quant, "quantize_dequantize": fp8jax.quantize_dequantize,
        "fused": fused_round_trip.quantize_dequantize_fused}[path]
  got = np.asarray(jax.jit(fn, static_argnums=1)(jnp.asarray(x), spec))
  b = _block(name)
  assert np.all(np.isnan(got[0, :b])) and np.all(np.isnan(got[1, :b]))
  assert np.all(np.isfinite(got[:, b:])) and np.all(np.isfinite(got[2:]))
  # The other blocks are quantized as if the non-finite ones held zeros (NVFP4's tensor
  # scale, too, comes from the finite blocks only).
  np.testing.assert_array_equal(got[0, b:], got[3, b:])
  clean = np.asarray(fn(jnp.asarray(_zeroed(x, b)), spec))
  np.testing.assert_array_equal(got[:, b:], clean[:, b:])
  np.testing.assert_array_equal(got[2:], clean[2:])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
def test_inf_in_the_cotangent_comes_back_nan(name):
  """The backward spec quantizes the cotangent by the same rule."""
  spec = SPECS[name]
  spec = spec if spec.backward is not None else spec.replace(backward=spec)
  x = jnp.asarray(np.random.default_rng(1).standard_normal((4, 256)), jnp.float32)
  g = np.ones((4, 256), np.float32)
  g[2, 5] = -np.inf
  _, vjp = jax.vjp(lambda v: fp8jax.fake_quant(v, spec), x)
  dx = np.asarray(vjp(jnp.asarray(g))[0])
  b = _block(name)
  assert np.all(np.isnan(dx[2, :b])) and np.all(np.isfinite(dx[2, b:]))
  assert np.all(np.isfinite(np.delete(dx, 2, axis=0)))


def _config(name):
  if name in RECIPES:
    return fp8jax.recipe(RECIPES[name])
  spec = SPECS[name].replace(backward=None)
  return fp8jax.GemmConfig(roles=fp8jax.RoleSpecs(input=spec, weight=spec, grad=spec))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
def test_gemm_operand_with_inf_gives_nonfinite_outputs(name):
  """Y = X W, dX = dY W^T, dW = X^T dY (one compilation): inf in rows 0 and 1 of X makes
  those rows of Y non-finite and leaves the others as without it; inf in W makes the
  columns of Y its block feeds non-finite; inf in dY reaches dX and dW."""
  cfg = _config(name)
  dims = (((1,), (0,)), ((), ()))

  @jax.jit
  def step(a, b, dy):
    y, vjp = jax.vjp(lambda u, v: fp8jax.fp8_dot_general(u, v, dims, config=cfg), a, b)
    return (y, *vjp(dy))

  x = _inputs()
  clean_x = _zeroed(x, _block(name))
  w = np.random.default_rng(2).standard_normal((256, 64)).astype(np.float32) / 16
  dy = np.ones((4, 64), np.float32)
  y, dx, dw = (np.asarray(v) for v in step(x, w, dy))
  clean_y = np.asarray(step(clean_x, w, dy)[0])
  assert not np.any(np.isfinite(y[:2])) and np.all(np.isfinite(y[2:]))
  np.testing.assert_array_equal(y[2:], clean_y[2:])
  assert np.all(np.isfinite(dx)) and not np.all(np.isfinite(dw))  # X's inf reaches dW
  w_bad, dy_bad = w.copy(), dy.copy()
  w_bad[7, 5] = np.inf  # quantized along K: its block feeds column 5 (and more for W tiles
  dy_bad[3, 3] = np.inf  # of 128 x 128); dY along N for Dgrad, along the tokens for Wgrad
  y, dx, dw = (np.asarray(v) for v in step(clean_x, w_bad, dy_bad))
  bad_cols = ~np.all(np.isfinite(y), axis=0)
  assert bad_cols[5] and np.all(np.isfinite(y[:, ~bad_cols]))
  assert not np.all(np.isfinite(dx[3])) and not np.all(np.isfinite(dw[:, 3]))
