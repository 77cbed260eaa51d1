"""Accumulation models: bit-exact tensor-core model, FP32 mode against float64."""

import functools

from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import accumulate
from tests.references import reference_gemm as rg


def _operands(rng, m, n, k, a_gran, b_gran, fmt="e4m3", scale=1.0, positive=False):
  a = rng.standard_normal((1, m, k)) * scale
  b = rng.standard_normal((1, n, k))
  if positive:
    a, b = np.abs(a), np.abs(b)
  spec = fp8jax.QuantSpec(format=fmt)
  qa = fp8jax.quantize(jnp.asarray(a, jnp.float32), spec.replace(granularity=a_gran))
  qb = fp8jax.quantize(jnp.asarray(b, jnp.float32), spec.replace(granularity=b_gran))
  return qa, qb


def _row_scales(qt):
  """scale_inv per row [R, nK] (rows expanded from the row block)."""
  s = np.asarray(qt.scale_inv, np.float32)[0]
  return np.repeat(s, qt.full_block[-2], axis=0)[: qt.shape[-2]]


@st.composite
def _tc_case(draw):
  k = draw(st.sampled_from([32, 64, 100, 128, 200, 256, 300]))
  m, n = draw(st.integers(1, 4)), draw(st.integers(1, 4))
  fraction_bits = draw(st.sampled_from([5, 10, 13]))
  block_size = draw(st.sampled_from([8, 16, 32]))
  interval = draw(st.sampled_from([None, block_size * 2, 128]))
  if interval is None:
    gran = fp8jax.per_axis(-1)
    b_gran = fp8jax.per_tensor()
  else:
    gran = fp8jax.tile(interval * draw(st.sampled_from([1, 2])))
    b_gran = fp8jax.block((interval, interval))
  fmt = draw(st.sampled_from(["e4m3", "e5m2"]))
  return (draw(st.integers(0, 2**31 - 1)), m, n, k, gran, b_gran, fmt,
          accumulate.Accumulation("tensor_core", fraction_bits, block_size, interval),
          draw(st.booleans()))


@pytest.mark.slow
@given(_tc_case())
def test_tensor_core_model_matches_loop_reference_bit_for_bit(case):
  seed, m, n, k, gran, b_gran, fmt, acc, positive = case
  rng = np.random.default_rng(seed)
  qa, qb = _operands(rng, m, n, k, gran, b_gran, fmt, scale=10.0 ** rng.uniform(-3, 3),
                     positive=positive)
  got = np.asarray(jax.jit(accumulate.scaled_matmul, static_argnums=2)(qa, qb, acc))[0]
  want = rg.ref_tensor_core_matmul(
      np.asarray(qa.data[0], np.float32), np.asarray(qb.data[0], np.float32),
      _row_scales(qa), _row_scales(qb), qa.full_block[-1], qb.full_block[-1],
      fraction_bits=acc.fraction_bits, block_size=acc.block_size,
      interval=acc.promotion_interval)
  np.testing.assert_array_equal(got, want)


def test_aligned_block_sum_truncates_toward_zero():
  # 2**13 + 0.75 with 13 fraction bits below 2**13: ulp is 1, 0.75 is dropped.
  terms = jnp.asarray([[2.0**13, 0.75, -0.5], [-(2.0**13), -0.75, 0.0], [0, 0, 0]], jnp.float32)
  np.testing.assert_array_equal(accumulate.aligned_block_sum(terms, 13), [2.0**13, -(2.0**13), 0])
  np.testing.assert_array_equal(accumulate.aligned_block_sum(terms, 15), [8192.25, -8192.75, 0])


@pytest.mark.slow
@pytest.mark.parametrize("a_gran,b_gran", [
    (fp8jax.tile(128), fp8jax.block((128, 128))),
    (fp8jax.per_tensor(), fp8jax.per_axis(-1)),
    (fp8jax.tile(32), fp8jax.tile(128)),
])
def test_fp32_mode_agrees_with_float64(a_gran, b_gran):
  rng = np.random.default_rng(1)
  qa, qb = _operands(rng, 16, 24, 1000, a_gran, b_gran)
  got = np.asarray(accumulate.scaled_matmul(qa, qb, accumulate.FP32), np.float64)
  da = np.asarray(fp8jax.dequantize(qa, jnp.float32), np.float64)
  db = np.asarray(fp8jax.dequantize(qb, jnp.float32), np.float64)
  want = np.einsum("bmk,bnk->bmn", da, db)
  bound = 1000 * 2.0**-24 * np.einsum("bmk,bnk->bmn", np.abs(da), np.abs(db))
  assert np.all(np.abs(got - want) <= bound)


@pytest.mark.slow
def test_promotion_reduces_error_and_never_needs_constant_scales():
  rng = np.random.default_rng(2)
  qa, qb = _operands(rng, 8, 8, 4096, fp8jax.per_axis(-1), fp8jax.per_axis(-1), positive=True)
  exact = np.asarray(accumulate.scaled_matmul(qa, qb, accumulate.FP32), np.float64)
  err = {}
  for name, acc in (("never", accumulate.HOPPER_NO_PROMOTION), ("128", accumulate.HOPPER)):
    y = np.asarray(accumulate.scaled_matmul(qa, qb, acc), np.float64)
    err[name] = np.max(np.abs(y - exact) / np.abs(exact))
  assert err["never"] > 10 * err["128"] and err["never"] > 1e-3
  tiles, _ = _operands(rng, 2, 2, 512, fp8jax.tile(128), fp8jax.tile(128))
  with pytest.raises(ValueError, match="scale blocks along K .* change inside"):
    accumulate.scaled_matmul(tiles, tiles, accumulate.HOPPER_NO_PROMOTION)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mode="fp16"), "unknown accumulation mode"),
    (dict(fraction_bits=23), "cannot be summed exactly"),
    (dict(promotion_interval=100), "multiple of block_size"),
    (dict(block_size=0), "block_size must be"),
])
def test_invalid_accumulation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    accumulate.Accumulation(**kwargs)


# --- FP32 mode: the interval loop, the old [M, N, J] formula, float64 -----------------


def _old_fp32_formula(qa, qb):
  """The FP32 mode before the interval loop: [B, M, N, J] partial products (f32)."""
  k = qa.shape[-1]
  interval = np.gcd(min(qa.full_block[-1], k), min(qb.full_block[-1], k))
  j = -(-k // interval)
  sa = accumulate._interval_scales(qa, interval, j)
  sb = accumulate._interval_scales(qb, interval, j)
  pad = [(0, 0), (0, 0), (0, j * interval - k)]
  a = jnp.pad(fp8jax.quant.qtensor.payload_f32(qa.data), pad)
  b = jnp.pad(fp8jax.quant.qtensor.payload_f32(qb.data), pad)
  nb, m, n = a.shape[0], a.shape[1], b.shape[1]
  parts = jnp.einsum("bmjc,bnjc->bmnj", a.reshape(nb, m, j, interval),
                     b.reshape(nb, n, j, interval), precision=jax.lax.Precision.HIGHEST,
                     preferred_element_type=jnp.float32)
  return jnp.sum(parts * (sa[:, :, None, :] * sb[:, None, :, :]), axis=-1)


def _f64_reference(qa, qb):
  """NumPy float64: sum_k (payload_a * scale_a) (payload_b * scale_b), exact products."""
  def deq(qt):
    data = np.asarray(qt.data.astype(jnp.float32), np.float64)
    s = np.asarray(qt.scale_inv.astype(jnp.float32), np.float64)
    for axis, size in enumerate(qt.full_block):
      s = np.repeat(s, size, axis=axis)
    return data * s[tuple(slice(0, d) for d in data.shape)]
  da, db = deq(qa), deq(qb)
  return np.einsum("bmk,bnk->bmn", da, db), np.einsum("bmk,bnk->bmn", np.abs(da), np.abs(db))


_GRANS = {"tile128/block128": (fp8jax.tile(128), fp8jax.block((128, 128))),
          "tensor/axis": (fp8jax.per_tensor(), fp8jax.per_axis(-1)),
          "tile32/tile128": (fp8jax.tile(32), fp8jax.tile(128)),
          "tile64/block64": (fp8jax.tile(64), fp8jax.block((64, 64)))}


@st.composite
def _fp32_case(draw):
  return (draw(st.integers(0, 2**31 - 1)), draw(st.integers(1, 2)), draw(st.integers(1, 9)),
          draw(st.integers(1, 9)), draw(st.sampled_from([1, 64, 128, 200, 384, 500])),
          draw(st.sampled_from(sorted(_GRANS))), draw(st.sampled_from(["e4m3", "e5m2"])),
          draw(st.sampled_from(["fp32", "pow2"])))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _fp32_loop_and_old(a, b, spec_a, spec_b):
  qa, qb = fp8jax.quantize(a, spec_a), fp8jax.quantize(b, spec_b)
  return (qa, qb, accumulate.scaled_matmul(qa, qb, accumulate.FP32, impl="xla"),
          _old_fp32_formula(qa, qb))


@pytest.mark.slow
@settings(max_examples=max(settings.default.max_examples // 4, 1))
@given(_fp32_case())
def test_fp32_interval_loop_matches_old_formula_and_float64(case):
  seed, nb, m, n, k, gran, fmt, scale_format = case
  rng = np.random.default_rng(seed)
  spec = fp8jax.QuantSpec(format=fmt, scale_format=scale_format)
  a_gran, b_gran = _GRANS[gran]
  a = rng.standard_normal((nb, m, k)) * 10.0 ** rng.uniform(-3, 3, (nb, m, 1))
  b = rng.standard_normal((nb, n, k))
  qa, qb, got, old = _fp32_loop_and_old(
      jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32),
      spec.replace(granularity=a_gran), spec.replace(granularity=b_gran))
  got, old = np.asarray(got, np.float64), np.asarray(old, np.float64)
  want, mag = _f64_reference(qa, qb)
  # float32 sums of k exact products (each interval), then <= k / interval promotions.
  bound = (k + 2) * 2.0**-24 * mag
  assert np.all(np.abs(got - want) <= bound)
  assert np.all(np.abs(got - old) <= 2 * bound)


def test_fp32_interval_loop_holds_no_per_interval_partials():
  """Compiled temporaries: no [B, M, N, J] float32 partial products (the old formula)."""
  m, n, k = 256, 256, 4096  # J = 32: 8 MiB of partial products in the old formula
  spec = fp8jax.QuantSpec()
  qa = jax.eval_shape(lambda x: fp8jax.quantize(x, spec.replace(granularity=fp8jax.tile(128))),
                      jax.ShapeDtypeStruct((1, m, k), jnp.float32))
  qb = jax.eval_shape(
      lambda x: fp8jax.quantize(x, spec.replace(granularity=fp8jax.block((128, 128)))),
      jax.ShapeDtypeStruct((1, n, k), jnp.float32))

  def temp_bytes(f):
    mem = jax.jit(f).lower(qa, qb).compile().memory_analysis()
    if mem is None:
      pytest.skip("no memory analysis on this backend")
    return mem.temp_size_in_bytes

  new = temp_bytes(lambda x, y: accumulate.scaled_matmul(x, y, impl="xla"))
  old = temp_bytes(_old_fp32_formula)
  # bfloat16 payload copies (4 MiB) and a few [M, N] float32 arrays.
  assert new < (m + n) * k * 2 + 6 * m * n * 4 and old > 3 * new, (new, old)


def test_fp32_impl_selection():
  e4m3, e5m2 = jnp.float8_e4m3fn, jnp.float8_e5m2
  assert accumulate.fp32_impl(128, (e4m3, e4m3), "auto", backend="cpu") == "xla"
  assert accumulate.fp32_impl(128, (e4m3, e5m2), "auto", backend="gpu") == "pallas"
  assert accumulate.fp32_impl(4096, (e4m3, e4m3), "auto", backend="gpu") == "pallas"
  assert accumulate.fp32_impl(1000, (e4m3, e4m3), "auto", backend="gpu") == "xla"
  assert accumulate.fp32_impl(128, (jnp.float32, e4m3), "auto", backend="gpu") == "xla"
  assert accumulate.fp32_impl(1000, (e4m3, e4m3), "xla", backend="gpu") == "xla"
  with pytest.raises(ValueError, match="does not handle promotion intervals of 1000"):
    accumulate.fp32_impl(1000, (e4m3, e4m3), "pallas")
  with pytest.raises(ValueError, match="unknown scaled_matmul implementation"):
    accumulate.fp32_impl(128, (e4m3,), "triton")
  assert accumulate.fp32_impl(128, (e4m3, e4m3), backend="gpu") == "pallas"  # "auto"
  qa, qb = _operands(np.random.default_rng(0), 2, 2, 128, fp8jax.tile(128), fp8jax.tile(128))
  with pytest.raises(ValueError, match="FP32 accumulation only"):
    accumulate.scaled_matmul(qa, qb, accumulate.HOPPER, impl="pallas")
