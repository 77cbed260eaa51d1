"""Intervals and tests on plain arrays (NumPy only): the statistics of the study's reports.

Per checkpoint, over its evaluation batches (:class:`Stat`):

* :func:`mean_ci`: the arithmetic mean with its two-sided 95% Student-t interval, for
  signed quantities (cosines, differences, fractions);
* :func:`log_ci`: the geometric mean exp(mean(log x)) with the t-interval of the logs,
  exponentiated, for positive quantities (norms, relative errors, ratios): its bounds stay
  positive and a ratio's interval is symmetric on the log scale;
* :func:`ci` picks one of the two, falling back to the t-interval (its lower bound clipped at
  0) when a positive quantity has an exact zero.

Across checkpoints (:class:`Summary`, :func:`median_boot`): the median over the checkpoints
of the per-checkpoint centers (arithmetic means, or means of the logs), with a 95%
percentile bootstrap interval that resamples the batches *within* each checkpoint
(a stratified bootstrap, fixed seed). The checkpoints are the study's design, fixed; the
evaluation batches are the random sample. A resample of n values has (n - 1) / n of the
variance of the sample, which makes a plain bootstrap of few batches too narrow (with 2
batches per checkpoint its 95% interval covered the true median in 62% of simulated
studies): each checkpoint's deviations from its mean are therefore scaled by sqrt(n / (n - 1))
before resampling, and there is no interval unless every checkpoint has at least
:data:`MIN_BATCHES` batches (the scaled bootstrap then covered 92% with 3 batches, 91% with 4,
94% with 8; ``tests/study/common/test_intervals.py``). A paired comparison of two
policies on the same batches is the same summary of the per-batch ratios (or differences).

Multiple comparisons: :func:`holm` (Holm's step-down adjustment, valid under any dependence
between the tests). Rank correlation: :func:`spearman_rows` (Spearman rho of many
resamples at once) and :func:`spearman_permutation` (two-sided permutation p-value).
tests/study/common/test_intervals.py checks every function against SciPy or a separate NumPy loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import dataclasses
import math

import numpy as np

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (3 decimals).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959963984540054

MIN_BATCHES = 3
"""The fewest batches per checkpoint for a bootstrap interval across checkpoints."""


def t_quantile(df: int) -> float:
  """The 97.5% quantile of Student's t with ``df`` degrees of freedom: the table for
  df <= 30, the Cornish-Fisher expansion of Abramowitz & Stegun 26.7.5 beyond (error below
  1e-6 there)."""
  if df < 1:
    raise ValueError(f"df must be >= 1, got {df}")
  if df <= len(_T975):
    return _T975[df - 1]
  x, v = _Z975, float(df)
  g1 = (x ** 3 + x) / 4
  g2 = (5 * x ** 5 + 16 * x ** 3 + 3 * x) / 96
  g3 = (3 * x ** 7 + 19 * x ** 5 + 17 * x ** 3 - 15 * x) / 384
  g4 = (79 * x ** 9 + 776 * x ** 7 + 1482 * x ** 5 - 1920 * x ** 3 - 945 * x) / 92160
  return x + g1 / v + g2 / v ** 2 + g3 / v ** 3 + g4 / v ** 4


@dataclasses.dataclass(frozen=True)
class Stat:
  """The center of ``n`` values with its 95% interval [lo, hi] (NaN when n < 2; center NaN
  when n == 0). ``mean`` is the arithmetic mean, or the geometric mean when ``log``;
  ``n_nonfinite`` rows were excluded as non-finite, ``n_undefined`` NaN values."""

  mean: float
  lo: float
  hi: float
  n: int
  n_nonfinite: int = 0
  n_undefined: int = 0
  log: bool = False

  @property
  def center(self) -> float:
    return self.mean

  @property
  def has_ci(self) -> bool:
    return self.n >= 2 and math.isfinite(self.lo)


def _split(values: Iterable[float]) -> tuple[np.ndarray, int]:
  x = np.asarray(list(values), np.float64)
  ok = x[~np.isnan(x)]
  return ok, int(x.size - ok.size)


def _t(x: np.ndarray) -> tuple[float, float, float]:
  """Mean and its 95% t-interval of a non-empty array (NaN bounds for one value)."""
  mean = float(x.mean())
  if x.size < 2:
    return mean, math.nan, math.nan
  half = t_quantile(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
  return mean, mean - half, mean + half


def mean_ci(values: Iterable[float], n_nonfinite: int = 0) -> Stat:
  """Mean and 95% t-interval (mean +- t_{0.975, n-1} s / sqrt(n), s with ddof 1); NaN
  values are left out and counted as undefined."""
  ok, undefined = _split(values)
  if not ok.size:
    return Stat(math.nan, math.nan, math.nan, 0, n_nonfinite, undefined)
  return Stat(*_t(ok), int(ok.size), n_nonfinite, undefined)


def log_ci(values: Iterable[float], n_nonfinite: int = 0) -> Stat:
  """Geometric mean and 95% interval exp(m +- t_{0.975, n-1} s / sqrt(n)) of the logs
  (m, s their mean and standard deviation). NaN and infinite values are left out and
  counted as undefined.

  Raises:
    ValueError: a value is <= 0 (use :func:`ci` for data that may hold zeros).
  """
  ok, undefined = _split(values)
  finite = ok[np.isfinite(ok)]
  undefined += int(ok.size - finite.size)
  if (finite <= 0).any():
    raise ValueError(f"log_ci: {int((finite <= 0).sum())} values <= 0 have no logarithm")
  if not finite.size:
    return Stat(math.nan, math.nan, math.nan, 0, n_nonfinite, undefined, log=True)
  m, lo, hi = _t(np.log(finite))
  return Stat(math.exp(m), math.exp(lo), math.exp(hi), int(finite.size), n_nonfinite,
              undefined, log=True)


def ci(values: Iterable[float], log: bool, n_nonfinite: int = 0) -> Stat:
  """:func:`log_ci` when ``log`` and every value is positive; otherwise :func:`mean_ci`,
  its lower bound clipped at 0 when ``log`` (a positive quantity with an exact zero)."""
  x = np.asarray(list(values), np.float64)
  if log and (x[np.isfinite(x)] > 0).all():
    return log_ci(x, n_nonfinite)
  st = mean_ci(x[~np.isinf(x)] if log else x, n_nonfinite)
  if log:
    undefined = st.n_undefined + int(np.isinf(x).sum())
    st = dataclasses.replace(st, lo=max(st.lo, 0.0) if st.has_ci else st.lo,
                             n_undefined=undefined)
  return st


@dataclasses.dataclass(frozen=True)
class Summary:
  """The median over ``n_steps`` checkpoints of their centers (arithmetic means, or
  geometric means when ``log``) with a 95% bootstrap interval [lo, hi] over the batches
  (NaN when a checkpoint has fewer than :data:`MIN_BATCHES` values); ``n`` values in all,
  ``n_nonfinite`` rows excluded as non-finite, ``n_undefined`` NaN values."""

  median: float
  lo: float
  hi: float
  n_steps: int
  n: int
  log: bool
  n_nonfinite: int = 0
  n_undefined: int = 0

  @property
  def center(self) -> float:
    return self.median

  @property
  def has_ci(self) -> bool:
    return self.n_steps >= 1 and math.isfinite(self.lo)


def median_boot(groups: Sequence[Iterable[float]], log: bool, n_boot: int = 2000,
                seed: int = 0, n_nonfinite: int = 0) -> Summary:
  """The median of the group centers with its percentile bootstrap 95% interval.

  Args:
    groups: the values of each checkpoint (one batch each; NaN and, when ``log``, infinite
      values are left out and counted as undefined; empty groups are dropped).
    log: centers and median on the log scale (when every value is positive; else the
      arithmetic scale, as :func:`ci`).
    n_boot: bootstrap resamples; each draws every group's batches with replacement, after
      scaling the group's deviations from its mean by sqrt(n / (n - 1)) (module docstring).
    seed: the resamples' seed (the interval is reproducible).
  """
  kept, undefined = [], 0
  for g in groups:
    x = np.asarray(list(g), np.float64)
    bad = np.isnan(x) | (np.isinf(x) if log else False)
    undefined += int(bad.sum())
    if (~bad).any():
      kept.append(x[~bad])
  n = sum(x.size for x in kept)
  log = log and all((x > 0).all() for x in kept)
  if not kept:
    return Summary(math.nan, math.nan, math.nan, 0, 0, log, n_nonfinite, undefined)
  kept = [np.log(x) for x in kept] if log else kept
  back = np.exp if log else (lambda v: v)
  median = float(back(np.median([x.mean() for x in kept])))
  lo = hi = math.nan
  if min(x.size for x in kept) >= MIN_BATCHES and n_boot > 0:
    rng = np.random.default_rng(seed)
    kept = [x.mean() + (x - x.mean()) * math.sqrt(x.size / (x.size - 1)) for x in kept]
    means = np.stack([x[rng.integers(0, x.size, (n_boot, x.size))].mean(1) for x in kept], 1)
    lo, hi = (float(v) for v in back(np.percentile(np.median(means, 1), [2.5, 97.5])))
  return Summary(median, lo, hi, len(kept), n, log, n_nonfinite, undefined)


def holm(pvalues: Sequence[float]) -> np.ndarray:
  """Holm's step-down adjusted p-values (same order; NaN stays NaN and is not counted in
  the family): with the m p-values sorted, p_(i) -> max_{j <= i} min(1, (m - j + 1) p_(j)).
  Controls the family-wise error rate under any dependence between the tests."""
  p = np.asarray(pvalues, np.float64)
  out = np.full(p.shape, math.nan)
  idx = np.flatnonzero(~np.isnan(p))
  m = idx.size
  if not m:
    return out
  order = idx[np.argsort(p[idx], kind="stable")]
  adj = np.minimum(1.0, (m - np.arange(m)) * p[order])
  out[order] = np.maximum.accumulate(adj)
  return out


def rank_rows(a: np.ndarray) -> np.ndarray:
  """1-based ranks along the last axis of a 2-D array, ties sharing their average rank."""
  a = np.asarray(a, np.float64)
  rows, n = a.shape
  _, dense = np.unique(a, return_inverse=True)  # one integer per distinct value
  keyed = (dense.reshape(rows, n) + np.arange(rows)[:, None] * (dense.max() + 1)).ravel()
  s = np.sort(keyed)
  offset = np.repeat(np.arange(rows) * n, n)
  left = np.searchsorted(s, keyed, "left") - offset
  right = np.searchsorted(s, keyed, "right") - offset
  return ((left + right + 1) / 2.0).reshape(rows, n)


def _pearson_rows(rx: np.ndarray, ry: np.ndarray) -> np.ndarray:
  dx = rx - rx.mean(-1, keepdims=True)
  dy = ry - ry.mean(-1, keepdims=True)
  den = np.sqrt((dx * dx).sum(-1) * (dy * dy).sum(-1))
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(den > 0, (dx * dy).sum(-1) / np.where(den > 0, den, 1.0), math.nan)


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Spearman rho of each row pair of two [rows, n] arrays (NaN for a constant row)."""
  return _pearson_rows(rank_rows(x), rank_rows(y))


def spearman_permutation(x: Sequence[float], y: Sequence[float], n_perm: int = 9999,
                         seed: int = 0) -> float:
  """Two-sided permutation p-value of Spearman's rho: (1 + #{|rho_perm| >= |rho|}) /
  (1 + n_perm) over ``n_perm`` random pairings of the finite pairs (NaN below 3 pairs or
  for a constant side)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  ok = np.isfinite(x) & np.isfinite(y)
  if ok.sum() < 3:
    return math.nan
  rx, ry = rank_rows(x[ok][None]), rank_rows(y[ok][None])
  rho = float(_pearson_rows(rx, ry)[0])
  if not math.isfinite(rho):
    return math.nan
  perm = np.random.default_rng(seed).permuted(np.repeat(ry, n_perm, 0), axis=1)
  null = _pearson_rows(np.repeat(rx, n_perm, 0), perm)
  hits = int((np.abs(null) >= abs(rho) - 1e-12).sum())
  return (1 + hits) / (1 + n_perm)
