"""Rank correlations of many predictor x outcome pairs, with a correction for testing many.

:func:`correlate` gives one pair's Spearman rho, a percentile bootstrap 95% CI over the
pairs, a two-sided permutation p-value (fixed seeds) and the mean within-group rho;
:func:`adjust` adds Holm-adjusted p-values over a family of them
(:func:`fp8jax.study.common.intervals.holm`). A relation is stated only when its adjusted p-value
is below :data:`ALPHA`: over a family of m tests, Holm's step-down method keeps the chance of
stating any false relation at ``ALPHA`` whatever the dependence between the tests (the
predictors of the trajectory study are strongly correlated with each other), and it is
uniformly more powerful than Bonferroni.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

import numpy as np

from fp8jax.metrics.ranking import spearman
from fp8jax.study.common.intervals import holm, spearman_permutation, spearman_rows

ALPHA = 0.05
"""The family-wise error rate of the stated relations."""
N_PERM = 9999
"""Permutations of the p-values (the smallest p-value is 1 / (N_PERM + 1))."""


def correlate(x: Sequence[float], y: Sequence[float], groups: Sequence[Any] | None = None,
              n_boot: int = 2000, seed: int = 0, n_perm: int = N_PERM) -> dict[str, Any]:
  """Spearman correlation of the pairs with finite x and y: ``rho``, percentile bootstrap
  95% CI ``lo``/``hi`` (``n_boot`` resamples of the pairs, ``seed``), permutation p-value
  ``p`` (``n_perm`` pairings, ``seed``), ``n``, ``n_excluded``, ``within`` (the mean over
  ``groups`` of their Spearman correlation, groups of >= 3 non-constant pairs) and
  ``n_groups``; ``reason`` (rho and p NaN) when there is not enough data. ``p_adj`` is NaN
  until :func:`adjust`."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  g = np.zeros(x.size, int) if groups is None else np.asarray(groups)
  ok = np.isfinite(x) & np.isfinite(y)
  x, y, g = x[ok], y[ok], g[ok]
  out = {"rho": math.nan, "lo": math.nan, "hi": math.nan, "p": math.nan, "p_adj": math.nan,
         "n": int(x.size), "n_excluded": int((~ok).sum()), "within": math.nan, "n_groups": 0,
         "reason": None}
  if x.size < 3:
    out["reason"] = f"{x.size} pairs, fewer than 3"
    return out
  if np.ptp(x) == 0 or np.ptp(y) == 0:
    out["reason"] = "constant " + ("predictor" if np.ptp(x) == 0 else "outcome")
    return out
  out["rho"] = spearman(x, y)
  out["p"] = spearman_permutation(x, y, n_perm, seed)
  if n_boot > 0:
    idx = np.random.default_rng(seed).integers(0, x.size, size=(n_boot, x.size))
    boot = spearman_rows(x[idx], y[idx])
    boot = boot[np.isfinite(boot)]
    if boot.size:
      out["lo"], out["hi"] = (float(v) for v in np.percentile(boot, [2.5, 97.5]))
  within = [spearman(x[g == k], y[g == k]) for k in dict.fromkeys(g.tolist())
            if (g == k).sum() >= 3]
  within = [w for w in within if math.isfinite(w)]
  if within:
    out["within"], out["n_groups"] = float(np.mean(within)), len(within)
  return out


def adjust(corr: dict[Any, dict[str, Any]]) -> int:
  """Sets ``p_adj`` (Holm over every correlation with a p-value) in place; returns the
  family size."""
  keys = list(corr)
  adj = holm([corr[k]["p"] for k in keys])
  for k, a in zip(keys, adj):
    corr[k]["p_adj"] = float(a)
  return int(np.isfinite(adj).sum())


def related(c: dict[str, Any], alpha: float = ALPHA) -> bool:
  """Whether a correlation states a relation: Holm-adjusted p below ``alpha``."""
  return math.isfinite(c["p_adj"]) and c["p_adj"] < alpha


def fmt_p(p: float) -> str:
  """A p-value with 2 significant digits ("n/a" when undefined)."""
  return "n/a" if not math.isfinite(p) else f"{p:.2g}"
