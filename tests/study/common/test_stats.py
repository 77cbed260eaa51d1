"""The report's statistics (fp8jax/study/common/stats.py) on the synthetic sweep folder with
known numbers (the builder of ``tests/study/test_sweep_report.py``): the t-intervals
against SciPy, non-finite values excluded and counted."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp8jax.study.common import stats
from tests.study.test_sweep_report import SEED, STEPS, rel_err


def test_t_quantile_and_mean_ci():
  assert stats.t_quantile(1) == 12.706 and stats.t_quantile(30) == 2.042
  assert stats.t_quantile(31) == pytest.approx(2.0395, abs=1e-4)  # test_intervals.py
  x = np.array([1.0, 2.0, 4.0])
  s = stats.mean_ci(list(x) + [math.nan], n_nonfinite=2)
  half = 4.303 * x.std(ddof=1) / math.sqrt(3)
  assert s.mean == pytest.approx(7 / 3) and s.n == 3
  assert (s.lo, s.hi) == pytest.approx((7 / 3 - half, 7 / 3 + half))
  assert (s.n_undefined, s.n_nonfinite) == (1, 2)
  one = stats.mean_ci([0.5])
  assert one.mean == 0.5 and not one.has_ci and math.isnan(one.lo)
  assert stats.mean_ci([]).n == 0 and math.isnan(stats.mean_ci([]).mean)


def _log_t(x) -> tuple[float, float, float]:
  """Geometric mean and exp of the 95% t-interval of the logs, by SciPy."""
  lx = np.log(x)
  lo, hi = scipy_stats.t.interval(0.95, lx.size - 1, lx.mean(), scipy_stats.sem(lx))
  return scipy_stats.gmean(x), math.exp(lo), math.exp(hi)


def test_summary_matches_scipy_and_excludes_nonfinite(res):
  table = stats.summary(res, "rel_err")
  assert set(table) == {(p, s) for p in SEED for s in STEPS}
  x = np.array([rel_err("attn_l0_e5m2", 2, j, False) for j in range(4)])
  st = table[("attn_l0_e5m2", 200)]
  assert st.log and st.n == 4
  assert (st.mean, st.lo, st.hi) == pytest.approx(_log_t(x), rel=2e-4)  # t table: 3 decimals
  bad = table[("moe_l0-8_e5m2", 100)]  # batch j = 2 (offset 8, batch 0) is non-finite
  x = np.array([rel_err("moe_l0-8_e5m2", 1, j, False) for j in (0, 1, 3)])
  assert (bad.n, bad.n_nonfinite) == (3, 1)
  assert (bad.mean, bad.lo, bad.hi) == pytest.approx(_log_t(x), rel=2e-4)
  cos = stats.stat(res, "cosine", "attn_l0_e5m2", [200])  # signed: arithmetic t-interval
  c = np.array([1 - rel_err("attn_l0_e5m2", 2, j, False) ** 2 / 2 for j in range(4)])
  want = scipy_stats.t.interval(0.95, 3, c.mean(), scipy_stats.sem(c))
  assert not cos.log and cos.mean == pytest.approx(c.mean())
  assert (cos.hi - cos.mean, cos.mean - cos.lo) == pytest.approx(
      (want[1] - c.mean(), c.mean() - want[0]), rel=2e-4)
  pooled = stats.stat(res, "rel_err", "moe_l0-8_e5m2")
  assert pooled.n == 15 and pooled.n_nonfinite == 1 and math.isfinite(pooled.mean)
  over = stats.overall(res, "rel_err", "moe_l0-8_e5m2")
  centers = [table[("moe_l0-8_e5m2", s)].mean for s in STEPS]
  assert over.median == pytest.approx(math.exp(np.median(np.log(centers))))
  assert (over.n_steps, over.n, over.n_nonfinite) == (4, 15, 1)
  assert 0 < over.lo <= over.median <= over.hi
