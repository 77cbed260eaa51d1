"""Block-scale telemetry of GEMM operands against a NumPy/ml_dtypes reference.

The reference quantizes E4M3 1x128 tiles with FP32 scales (s = 448 / amax) by an
ml_dtypes cast, block by block, and counts in float64.
"""

import functools

from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import operand_telemetry as ot
from fp8jax.study.common import metric_registry
from tests import strategies as hs
from tests.numerics.test_four_over_six import reference as four_over_six_reference
from tests.references import reference_scale_rules as scale_rules


def reference(x: np.ndarray, tile: int = 128) -> dict:
  rows, cols = x.shape
  scales, sat, under, zero, q = [], 0, 0, 0, np.zeros_like(x, np.float64)
  n_blocks = rows * (-(-cols // tile))
  for r in range(rows):
    for c0 in range(0, cols, tile):
      blk = x[r, c0:c0 + tile].astype(np.float64)
      amax = np.max(np.abs(blk))
      if amax == 0:
        zero += 1
        continue
      s = np.float32(448.0) / np.float32(amax)
      scaled = (blk.astype(np.float32) * s)
      pay = scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
      sat += bool(np.any(np.abs(scaled) > 464))  # 448 + half an ulp of the top binade
      under += bool(np.any((blk != 0) & (pay == 0)))
      q[r, c0:c0 + tile] = pay * np.float64(np.float32(1) / s)
      scales.append(np.floor(np.log2(np.float32(1) / s)))
  kurt = q.size * np.sum(q ** 4) / np.sum(q ** 2) ** 2
  return {"saturated_frac": sat / n_blocks, "underflow_frac": under / n_blocks,
          "zero_block_frac": zero / n_blocks, "kurtosis": kurt,
          "scale_log2_p50": np.sort(scales)[int(np.ceil(0.5 * len(scales))) - 1],
          "scale_log2s": scales}


@pytest.mark.slow
def test_operand_telemetry_matches_the_reference():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((12, 384)).astype(np.float32)
  x *= np.exp(3 * rng.standard_normal((12, 1))).astype(np.float32)  # rows of other scales
  x[3, :128] = 0.0                       # an all-zero block
  x[5, 130] = 1e-9 * np.abs(x[5, 128:256]).max()  # flushed to zero beside a large amax
  spec = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.tile(128))
  sums = ot.operand_sums(jnp.asarray(x), spec)
  got = jax.device_get(ot.summarize(sums))
  want = reference(x)
  # The histogram of floor(log2 scale_inv) over the nonzero blocks, by NumPy's bincount.
  logs = np.array(want.pop("scale_log2s"), np.int64) - ot.LOG2_LOW
  np.testing.assert_array_equal(np.asarray(sums["log2_hist"]),
                                np.bincount(logs, minlength=ot.LOG2_BINS))
  assert want["underflow_frac"] > 0 and want["zero_block_frac"] > 0
  for k, v in want.items():
    np.testing.assert_allclose(float(got[k]), v, rtol=1e-4, err_msg=k)


@pytest.mark.slow
def test_operand_sums_add_up_and_do_not_touch_gradients():
  spec = fp8jax.preset("mxfp4")
  a = jax.random.normal(jax.random.key(0), (4, 64))
  b = jax.random.normal(jax.random.key(1), (8, 64)) * 1e3
  both = ot.summarize(ot.operand_sums(jnp.concatenate([a, b]), spec))
  added = ot.summarize(ot.add(ot.operand_sums(a, spec), ot.operand_sums(b, spec)))
  for k in ("saturated_frac", "underflow_frac", "zero_block_frac", "scale_log2_p05",
            "scale_log2_p95"):
    assert float(both[k]) == float(added[k]), k
  assert float(both["saturated_frac"]) > 0  # the OCP rule saturates up to one binade
  g = jax.grad(lambda v: ot.summarize(ot.operand_sums(v, spec))["kurtosis"] + jnp.sum(v))(a)
  np.testing.assert_array_equal(g, jnp.ones_like(a))


def test_histogram_counts_bins_as_bincount_does():
  rng = np.random.default_rng(4)
  bins = rng.integers(0, ot.LOG2_BINS + 1, 5000).astype(np.int32)  # LOG2_BINS: ignored
  bins[:50] = 7  # a crowded bin
  got = np.asarray(ot._histogram(jnp.asarray(bins)))
  want = np.bincount(bins[bins < ot.LOG2_BINS], minlength=ot.LOG2_BINS)
  np.testing.assert_array_equal(got, want)
  assert got.dtype == np.float32 and got.sum() < bins.size


@functools.cache
def _sums(spec):
  return jax.jit(lambda v: ot.operand_sums(v, spec))


@settings(max_examples=hs.examples(3, 20), deadline=None)
@given(seed=st.integers(0, 2**31 - 1), spread=st.sampled_from([0.5, 3.0]),
       fmt=st.sampled_from(["e2m1", "e4m3"]))
def test_scale_rule_shares_match_a_numpy_count(seed, spread, fmt):
  """``four_frac`` and ``oas_raised_frac``: of the live blocks of the operands quantized
  with Four Over Six (OAS), those scaled to 4 (raised a binade above the OCP rule), by the
  NumPy references; an all-zero block and a block holding NaN count for neither; NaN for
  a rule no operand uses; operands add."""
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((6, 64)) * np.exp(rng.uniform(-spread, spread, (6, 1)))
       ).astype(np.float32)
  x[0, :32] = 0.0
  x_nan = x.copy()
  x_nan[-1, 40] = np.nan
  oas = fp8jax.preset("mxfp4" if fmt == "e2m1" else "mxfp8").replace(
      backward=None, pow2_rounding="oas")
  four = fp8jax.preset("nvfp4").replace(backward=None, four_over_six="mae")
  s_oas, s_four = _sums(oas)(jnp.asarray(x_nan)), _sums(four)(jnp.asarray(x))
  raised, live = scale_rules.oas_raised(x_nan, fmt), scale_rules.live_blocks(x_nan, 32)
  chose = four_over_six_reference(x, "mae")[3][scale_rules.live_blocks(x, 16)]
  got_oas, got_four = ot.summarize(s_oas), ot.summarize(s_four)
  assert float(got_oas["oas_raised_frac"]) == pytest.approx(raised.sum() / live.sum(), 1e-6)
  assert float(got_four["four_frac"]) == pytest.approx(chose.mean(), 1e-6)
  assert np.isnan(float(got_oas["four_frac"])) and np.isnan(float(got_four["oas_raised_frac"]))
  both = ot.summarize(ot.add(s_oas, s_four))
  assert float(both["four_frac"]) == float(got_four["four_frac"])
  assert float(both["oas_raised_frac"]) == float(got_oas["oas_raised_frac"])


def test_every_summary_field_is_a_registered_report_metric():
  """What :func:`summarize` returns reaches the sweep's rows (``tel/<name>``) and the
  report's tables through the metric registry, and nothing registered is missing."""
  sums = _sums(fp8jax.preset("mxfp8").replace(backward=None))(jnp.ones((2, 32)))
  assert set(ot.summarize(sums)) == set(metric_registry.telemetry())
