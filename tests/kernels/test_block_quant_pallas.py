"""The one-pass square-block quantization of stacked weights (``block_quant_pallas``,
interpreted).

In interpret mode on the CPU the kernel's FP8 conversion is XLA:CPU's, so these tests check
its blocking, indexing, NaN handling, scales and per-block statistics; the bits of the GPU's
conversion are checked on the device by ``scripts/bench/block_quant.py``.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import operand_telemetry as ot
from fp8jax.kernels import block_quant_pallas as bq
from tests import strategies as hs
from tests.references import reference as ref

# The library's functions compiled whole, as the GEMMs run them (op by op, each of their
# operations would compile on its own for every shape: seconds per test).
_block_stats = jax.jit(ot.block_stats, static_argnums=1)
_sums_of_blocks = jax.jit(ot.sums_of_blocks, static_argnames="experts")
_expert_sums = jax.jit(ot.expert_sums, static_argnums=1)


def _spec(fmt="e4m3", b=128):
  return fp8jax.QuantSpec(format=fmt, granularity=fp8jax.block((b, b)))


def _check(w, spec, in_dtype=None):
  """The kernel's payload, scales and statistics against ``qtensor.quantize`` and
  ``operand_telemetry.block_stats`` of each ``w[e]`` and, for the bits, the NumPy loops."""
  data, scale_inv, stats = bq.quantize_blocks(jnp.asarray(w), spec, in_dtype=in_dtype,
                                              stats=True, interpret=True)
  b = bq.block_of(spec)
  rounded = w if in_dtype is None else w.astype(in_dtype)
  for e in range(w.shape[0]):
    want_data, want_scales, _ = ref.ref_quantize(np.asarray(rounded[e]), spec.format, "block",
                                                 (0, 1), (b, b), eps=spec.eps,
                                                 margin=spec.margin)
    assert ref.same_bits(np.asarray(data[e]), want_data)
    assert ref.same_bits(np.asarray(scale_inv[e]), want_scales)
    qt, want = _block_stats(jnp.asarray(rounded[e]), spec)
    assert ref.same_bits(np.asarray(data[e]), np.asarray(qt.data))
    for name in ("amax", "saturated", "finite"):
      np.testing.assert_array_equal(np.asarray(stats[name][e]), np.asarray(want[name]), name)
    # flushed: by NumPy, where float32 subnormal inputs are nonzero (as on a GPU and in the
    # kernel); XLA:CPU's comparison in block_stats reads them as zero
    x = np.asarray(rounded[e], np.float32)
    lost = np.isfinite(x) & (x != 0) & (want_data.astype(np.float32) == 0)
    r, c = x.shape
    np.testing.assert_array_equal(np.asarray(stats["flushed"][e]),
                                  lost.reshape(r // b, b, c // b, b).any(axis=(1, 3)))
    for name in ("sum_q2", "sum_q4"):  # summed in another order: b*b positive terms
      # differ by at most (b*b - 1) float32 roundings of the sum; XLA:CPU flushes each
      # float32 subnormal square (below 2^-126) where its fusion makes one
      np.testing.assert_allclose(np.asarray(stats[name][e]), np.asarray(want[name]),
                                 rtol=b * b * np.finfo(np.float32).eps,
                                 atol=b * b * np.finfo(np.float32).tiny, err_msg=name)
  return data, scale_inv, stats


@pytest.mark.parametrize("fmt,b,dtype,in_dtype", [
    ("e4m3", 128, "float32", "bfloat16"), ("e5m2", 32, "float32", None),
    ("e4m3", 16, "float16", None)])
def test_payload_scales_and_stats_equal_the_references(fmt, b, dtype, in_dtype):
  """Experts and blocks at different scales, NaN, ±inf, a zero block, a value flushed to
  zero beside a large one, and subnormals."""
  rng = np.random.default_rng(5)
  e, r, c = 2, 2 * b, 3 * b
  per_block = np.exp2(rng.integers(-8, 8, (e, 2, 3)))
  w = rng.standard_normal((e, r, c)) * np.repeat(np.repeat(per_block, b, 1), b, 2)
  w[0, :b, :b] = 0.0                              # an all-zero block
  w[0, 0, b:b + 3] = [np.nan, np.inf, -np.inf]    # NaN and inf blocks
  w[1, b + 1, :2] = [6e4 if dtype == "float16" else 1e6, 1e-6]  # flushed beside a large amax
  w[1, 3, 2 * b] = 1e-41 if dtype == "float32" else 3.0  # float32: a subnormal beside normals
  if dtype == "float32" and in_dtype is None:
    w[1, b:, 2 * b:] = 1e-40 * np.sign(w[1, b:, 2 * b:])  # a block of subnormals only
  w = w.astype(hs.DTYPES[dtype])
  data, scale_inv, stats = _check(w, _spec(fmt, b), in_dtype and hs.DTYPES[in_dtype])
  assert data.shape == (e, r, c) and scale_inv.shape == (e, 2, 3)
  s = {k: np.asarray(v) for k, v in stats.items()}
  assert s["amax"][0, 0, 0] == 0 and np.isinf(s["amax"][0, 0, 1])
  assert s["saturated"][0, 0, 1] == 1 and s["flushed"][1, 1, 0] == 1
  assert s["finite"][0, 0, 1] == b * b - 3 and np.isnan(np.asarray(scale_inv)[0, 0, 1])


@settings(max_examples=hs.examples(2, 10), deadline=None)
@given(st.data())
def test_random_stacks_equal_the_references(data):
  """Hypothesis: shapes, formats, block sides, dtypes and magnitudes."""
  b = data.draw(st.sampled_from([16, 32]))
  fmt = data.draw(st.sampled_from(["e4m3", "e5m2"]))
  e, nr, nc = (data.draw(st.integers(1, 2)) for _ in range(3))
  w = data.draw(hs.arrays((e, nr * b, nc * b)))
  _check(w, _spec(fmt, b))


def test_a_negative_margin_saturates_finite_blocks():
  """margin -1 scales amax to twice the format's largest value: every nonzero finite block
  saturates (the kernel's shortcut from the amax), the NaN block element by element."""
  rng = np.random.default_rng(2)
  w = rng.standard_normal((1, 32, 48)).astype(np.float32)
  w[0, :16, :16] = 0.0
  w[0, 20, 40] = np.nan
  spec = _spec("e4m3", 16).replace(margin=-1)
  _, _, stats = _check(w, spec)
  # the NaN block is scaled by 1 (its scale_inv is NaN): nothing in it saturates
  np.testing.assert_array_equal(np.asarray(stats["saturated"][0]), [[0, 1, 1], [1, 1, 0]])


def test_stats_reduce_to_operand_sums():
  """The telemetry from the kernel's statistics equals ``expert_sums`` of the weights:
  counts and histogram exactly, the float32 sums to rounding."""
  rng = np.random.default_rng(1)
  w = (rng.standard_normal((3, 64, 96)) * np.exp2(rng.integers(-20, 20, (3, 1, 1))))
  w[1, :32, :32] = 0.0
  w = w.astype(np.float32)
  spec = _spec("e4m3", 32)
  data, scale_inv, stats = bq.quantize_blocks(jnp.asarray(w), spec, stats=True,
                                              interpret=True)
  qt = fp8jax.QTensor(data, scale_inv, (1, 32, 32), jnp.dtype(jnp.float32))
  got = _sums_of_blocks(qt, stats, experts=True)
  want = _expert_sums(jnp.swapaxes(jnp.asarray(w), -1, -2), spec)  # as the GEMM's W^T
  for k in want:
    if k in ("sum_q2", "sum_q4", "kurtosis_sum"):
      np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5)
    else:
      np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), k)
  assert float(got["zero_blocks"]) == 1


def test_refuses_what_it_does_not_take():
  w = jnp.ones((2, 64, 64), jnp.float32)
  assert bq.block_of(fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.tile(128))) is None
  assert bq.block_of(fp8jax.preset("mxfp8")) is None
  with pytest.raises(ValueError, match="multiples of the 32-element block; got shape"):
    bq.quantize_blocks(w[:, :48], _spec("e4m3", 32), interpret=True)
  with pytest.raises(ValueError, match="square-block spec .*got e4m3 1x32"):
    bq.quantize_blocks(w, fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.tile(32)),
                       interpret=True)
  with pytest.raises(TypeError, match="16- or 32-bit float w"):
    bq.quantize_blocks(w.astype(ml_dtypes.float8_e4m3fn), _spec("e4m3", 32), interpret=True)
  with pytest.raises(TypeError, match="in_dtype"):
    bq.quantize_blocks(w, _spec("e4m3", 32), in_dtype=jnp.int8, interpret=True)
