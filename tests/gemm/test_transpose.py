"""Transposed-operand policies."""

from hypothesis import given
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import transpose
from tests import strategies


def _x(seed=0, shape=(256, 384)):
  rng = np.random.default_rng(seed)
  rows = 10.0 ** rng.uniform(-1, 1, (shape[0], 1))  # rows of different magnitude
  return jnp.asarray(rng.standard_normal(shape) * rows, jnp.float32)


def _specs(scale_format):
  return fp8jax.QuantSpec(granularity=fp8jax.tile(128), scale_format=scale_format,
                          pow2_rounding="rceil" if scale_format == "pow2" else None)


@pytest.mark.slow
def test_requant_is_quantizing_the_transpose():
  x = _x()
  spec = _specs("fp32")
  got = transpose.transposed(x, fp8jax.quantize(x, spec), spec, "requant")
  want = fp8jax.quantize(x.T, spec)
  np.testing.assert_array_equal(np.asarray(got.data).view(np.uint8),
                                np.asarray(want.data).view(np.uint8))


@pytest.mark.slow
@given(spec=strategies.specs(rank=2), x=strategies.arrays((48, 40)))
def test_quantize_swapped_equals_quantizing_the_swapped_array(spec, x):
  """The amax taken on x's own layout changes nothing, under jit as XLA:GPU runs it."""
  x = jnp.asarray(x)
  got = jax.jit(lambda a: transpose.quantize_swapped(a, spec))(x)
  want = jax.jit(lambda a: fp8jax.quantize(a, spec))(x.T)
  for g, w in ((got.data, want.data), (got.scale_inv, want.scale_inv)):
    g, w = np.asarray(g), np.asarray(w)
    np.testing.assert_array_equal(g.view(np.uint8 if g.itemsize == 1 else np.uint32),
                                  w.view(np.uint8 if w.itemsize == 1 else np.uint32))


@pytest.mark.slow
@given(spec=strategies.specs(rank=2), x=strategies.arrays((48, 40)))
def test_quantize_columns_is_the_swapped_quantization_in_place(spec, x):
  """The Wgrad operands of a contraction-first kernel: the quantization of x^T, left in
  x's layout, bit for bit (payload and scales transposed back)."""
  x = jnp.asarray(x)
  if spec.rounding != "nearest":
    with pytest.raises(ValueError, match="nearest only"):
      transpose.quantize_columns(x, spec)
    return
  got = jax.jit(lambda a: transpose.quantize_columns(a, spec))(x)
  want = jax.jit(lambda a: fp8jax.quantize(a, spec))(x.T)
  assert got.data.shape == x.shape
  for g, w in ((got.data, want.data.T), (got.scale_inv, want.scale_inv.T)):
    g, w = np.asarray(g), np.asarray(w)
    np.testing.assert_array_equal(g.view(np.uint8 if g.itemsize == 1 else np.uint32),
                                  w.view(np.uint8 if w.itemsize == 1 else np.uint32))


@pytest.mark.slow
def test_scaling_aware_transpose_is_exact_with_pow2_scales():
  x = _x()
  spec = _specs("pow2")
  qt = fp8jax.quantize(x, spec)
  t = transpose.scaling_aware_transpose(qt, spec)
  assert t.shape == (384, 256) and t.scale_inv.shape == (384, 2)
  before = np.asarray(fp8jax.dequantize(qt, jnp.float32)).T
  after = np.asarray(fp8jax.dequantize(t, jnp.float32))
  new_inv = np.repeat(np.asarray(t.scale_inv), 128, axis=1)[:, :256]
  # Exact wherever the re-scaled value stays in the normal FP8 range...
  normal = np.abs(before) >= fp8jax.get_format("e4m3").min_normal * new_inv
  assert normal.mean() > 0.9
  np.testing.assert_array_equal(after[normal], before[normal])
  # ...and underflow loses at most half an FP8 subnormal step (2**-9) of the new scale.
  assert np.all(np.abs(after - before) <= new_inv * 2.0**-10)


@pytest.mark.slow
def test_double_quant_rounds_again_with_fp32_scales_only():
  x = _x(1)
  changed = {}
  for scale_format in ("fp32", "pow2"):
    spec = _specs(scale_format)
    qt = fp8jax.quantize(x, spec)
    ref = np.asarray(fp8jax.dequantize(qt, jnp.float32)).T
    t = transpose.transposed(x, qt, spec, "double")
    changed[scale_format] = np.asarray(fp8jax.dequantize(t, jnp.float32)) != ref
    if scale_format == "pow2":  # only values in the new scale's subnormal range move
      new_inv = np.repeat(np.asarray(t.scale_inv), 128, axis=1)[:, :256]
      tiny = np.abs(ref) < fp8jax.get_format("e4m3").min_normal * new_inv
      assert not np.any(changed["pow2"] & ~tiny)
  assert changed["fp32"].mean() > 0.05 and changed["pow2"].mean() < 0.01
  aware = transpose.scaling_aware_transpose(fp8jax.quantize(x, _specs("fp32")), _specs("fp32"))
  ref = np.asarray(fp8jax.dequantize(fp8jax.quantize(x, _specs("fp32")), jnp.float32)).T
  assert np.mean(np.asarray(fp8jax.dequantize(aware, jnp.float32)) != ref) > 0.05


def test_symmetric_blocks_transpose_exactly_under_every_policy():
  w = _x(2)
  spec = fp8jax.QuantSpec(granularity=fp8jax.block((128, 128)))
  qt = fp8jax.quantize(w, spec)
  for policy in transpose.POLICIES:
    t = transpose.transposed(w, qt, spec, policy)
    np.testing.assert_array_equal(np.asarray(t.data).view(np.uint8),
                                  np.asarray(qt.data).T.view(np.uint8))


def test_unknown_policy():
  x = _x()
  with pytest.raises(ValueError, match="unknown transpose policy 'lazy'"):
    transpose.transposed(x, fp8jax.quantize(x, _specs("fp32")), _specs("fp32"), "lazy")


def test_scaling_aware_transpose_stores_the_target_scale_format():
  x = _x(3)
  target = _specs("pow2").replace(store_e8m0=True)
  t = transpose.scaling_aware_transpose(fp8jax.quantize(x, _specs("pow2")), target)
  assert t.scale_inv.dtype == jnp.float8_e8m0fnu
