"""Accumulation models: bit-exact tensor-core model, FP32 mode against float64."""

from hypothesis import given
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax import accumulate
from tests import reference_gemm as rg


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
