"""The report's statistics (fp8jax/study/common/intervals.py) against SciPy and
separate NumPy loops on fixed and generated data."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp8jax.metrics import ranking
from fp8jax.study.common import intervals as iv

SAMPLES = st.lists(st.floats(0.01, 100.0), min_size=2, max_size=12).filter(
    lambda v: np.ptp(v) > 1e-6 * max(v))


def test_t_quantile_matches_scipy():
  for df in range(1, 400):
    want = scipy_stats.t.ppf(0.975, df)
    assert iv.t_quantile(df) == pytest.approx(want, abs=5e-4 if df <= 30 else 1e-6), df
  with pytest.raises(ValueError, match="df must be >= 1"):
    iv.t_quantile(0)


def _scipy_t(x) -> tuple[float, float, float]:
  x = np.asarray(x, np.float64)
  lo, hi = scipy_stats.t.interval(0.95, x.size - 1, x.mean(), scipy_stats.sem(x))
  return float(x.mean()), float(lo), float(hi)


@settings(max_examples=40, deadline=None)
@given(SAMPLES)
def test_mean_and_log_intervals_match_scipy(values):
  x = np.asarray(values)
  s = iv.mean_ci(x)
  mean, lo, hi = _scipy_t(x)
  tol = 5e-4 * (hi - mean) + 1e-12  # the t table has 3 decimals
  assert s.mean == pytest.approx(mean) and not s.log
  assert s.lo == pytest.approx(lo, abs=tol) and s.hi == pytest.approx(hi, abs=tol)
  g = iv.log_ci(x)
  mean, lo, hi = _scipy_t(np.log(x))
  assert g.log and g.mean == pytest.approx(scipy_stats.gmean(x))
  assert math.log(g.lo) == pytest.approx(lo, abs=5e-4 * (hi - mean) + 1e-12)
  assert math.log(g.hi) == pytest.approx(hi, abs=5e-4 * (hi - mean) + 1e-12)
  assert 0 < g.lo <= g.mean <= g.hi
  assert iv.ci(x, True) == g and iv.ci(x, False) == s


def test_intervals_count_and_fall_back():
  s = iv.log_ci([1.0, 2.0, 4.0, math.nan, math.inf], n_nonfinite=2)
  assert (s.mean, s.n, s.n_undefined, s.n_nonfinite) == (pytest.approx(2.0), 3, 2, 2)
  assert not iv.log_ci([3.0]).has_ci and iv.log_ci([]).n == 0
  with pytest.raises(ValueError, match="values <= 0"):
    iv.log_ci([0.0, 1.0])
  z = iv.ci([0.0, 0.01, 0.2], log=True)  # an exact zero: the t-interval, clipped at 0
  assert not z.log and z.lo == 0.0 and z.mean == pytest.approx(0.07)
  assert _scipy_t([0.0, 0.01, 0.2])[1] < 0  # which the unclipped interval is not
  assert iv.ci([-1.0, 1.0, 2.0], log=False).lo < 0  # a signed quantity keeps its interval


def _median_of_means(*groups, axis=-1, log=False):
  means = [(np.log(g) if log else g).mean(axis=axis) for g in groups]
  return np.median(np.stack(means, -1), axis=-1)


@pytest.mark.parametrize("log", [True, False])
def test_median_boot_matches_scipy_bootstrap(log):
  """Resampling the batches within each checkpoint, each checkpoint's deviations from its
  mean scaled by sqrt(n / (n - 1)), is SciPy's multi-sample bootstrap of the scaled data."""
  rng = np.random.default_rng(1)
  groups = [rng.lognormal(0.0, 0.5, n) for n in (4, 6, 5, 3, 8)]
  got = iv.median_boot(groups, log, n_boot=20000, seed=0)
  scaled = []
  for g in groups:
    z = np.log(g) if log else g
    z = z.mean() + (z - z.mean()) * np.sqrt(len(z) / (len(z) - 1.0))
    scaled.append(np.exp(z) if log else z)
  want = scipy_stats.bootstrap(tuple(scaled), lambda *g, axis=-1: _median_of_means(
      *g, axis=axis, log=log), n_resamples=20000, method="percentile", vectorized=True,
                               rng=np.random.default_rng(7)).confidence_interval
  back = np.exp if log else (lambda v: v)
  lo, hi = back(want.low), back(want.high)
  assert got.median == pytest.approx(float(back(_median_of_means(*groups, log=log))))
  assert got.lo == pytest.approx(lo, abs=0.05 * (hi - lo))  # Monte Carlo error only
  assert got.hi == pytest.approx(hi, abs=0.05 * (hi - lo))
  assert (got.n_steps, got.n, got.log) == (5, 26, log)
  again = iv.median_boot(groups, log, n_boot=20000, seed=0)
  assert again == got  # the seed fixes the interval


def test_median_boot_covers_with_few_batches():
  """95% intervals of simulated studies (7 checkpoints, normal batches) cover the true
  median of the checkpoint means at about their level; a plain bootstrap of 2 or 3 batches
  did not (62% and 82%), so 2 batches per checkpoint give no interval."""
  rng = np.random.default_rng(0)
  centers = np.arange(7.0)
  for n, least in ((3, 0.86), (4, 0.86)):
    hits = 0
    for t in range(300):
      s = iv.median_boot([rng.normal(c, 1.0, n) for c in centers], False, n_boot=1000, seed=t)
      hits += s.lo <= 3.0 <= s.hi
    assert hits / 300 >= least, (n, hits)
  assert not iv.median_boot([rng.normal(c, 1.0, 2) for c in centers], False).has_ci


def test_median_boot_edge_cases():
  one = iv.median_boot([[1.0, 2.0], [3.0]], True)  # a checkpoint of one batch: no interval
  assert one.median == pytest.approx(math.exp(np.median([math.log(2) / 2, math.log(3)])))
  assert not one.has_ci
  s = iv.median_boot([[1.0, math.nan, 2.0, 3.0], [], [math.inf, 4.0, 8.0, 6.0]], True,
                     n_nonfinite=3)
  assert (s.n_steps, s.n, s.n_undefined, s.n_nonfinite) == (2, 6, 2, 3)
  assert s.log and 0 < s.lo <= s.median <= s.hi
  z = iv.median_boot([[0.0, 1.0, 1.0], [2.0, 3.0, 3.0]], True)  # a zero: arithmetic scale
  assert not z.log and z.median == pytest.approx(5 / 3)
  assert iv.median_boot([[math.nan]], True).n_steps == 0


def _holm_loop(p):
  """Holm by the textbook loop: reject in ascending order while p_(i) <= alpha / (m - i)."""
  p = list(p)
  m = len(p)
  order = sorted(range(m), key=lambda i: p[i])
  out, running = [0.0] * m, 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p[i]))
    out[i] = running
  return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20))
def test_holm_matches_the_loop(p):
  assert iv.holm(p) == pytest.approx(_holm_loop(p))


def test_holm_textbook_and_nan():
  adj = iv.holm([0.01, 0.04, 0.03, 0.005, math.nan])
  assert adj[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(adj[4])
  assert iv.holm([]).size == 0 and np.isnan(iv.holm([math.nan])).all()


def test_rank_rows_and_spearman_rows_match_scipy():
  rng = np.random.default_rng(2)
  a = rng.integers(0, 4, (50, 9)).astype(float)  # many ties
  b = rng.normal(size=(50, 9))
  assert np.array_equal(iv.rank_rows(a), scipy_stats.rankdata(a, axis=1))
  rho = iv.spearman_rows(a, b)
  for i in range(50):
    want = scipy_stats.spearmanr(a[i], b[i]).statistic if np.ptp(a[i]) else math.nan
    assert rho[i] == pytest.approx(want, nan_ok=True)
    assert rho[i] == pytest.approx(ranking.spearman(a[i], b[i]), nan_ok=True)


def _spearman_vectorized(x, y, axis=-1):
  rx, ry = scipy_stats.rankdata(x, axis=axis), scipy_stats.rankdata(y, axis=axis)
  rx = rx - rx.mean(axis, keepdims=True)
  ry = ry - ry.mean(axis, keepdims=True)
  return (rx * ry).sum(axis) / np.sqrt((rx * rx).sum(axis) * (ry * ry).sum(axis))


@pytest.mark.parametrize("noise", [0.5, 2.0, 10.0])
def test_spearman_permutation_matches_scipy(noise):
  rng = np.random.default_rng(3)
  x = rng.normal(size=14)
  y = x + noise * rng.normal(size=14)
  want = scipy_stats.permutation_test((x, y), _spearman_vectorized, vectorized=True,
                                      permutation_type="pairings", n_resamples=19999,
                                      rng=np.random.default_rng(0)).pvalue
  got = iv.spearman_permutation(x, y, n_perm=19999, seed=0)
  assert got == pytest.approx(want, abs=max(0.01, 0.1 * want))
  assert iv.spearman_permutation(x, y, 19999, 0) == got  # the seed fixes it
  assert math.isnan(iv.spearman_permutation([1.0, 2.0], [1.0, 2.0]))
  assert math.isnan(iv.spearman_permutation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))

