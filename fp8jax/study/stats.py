"""Statistics over a loaded sweep (:class:`fp8jax.study.results.Results`).

Means are over the evaluation batches of one or more checkpoints, with two-sided 95%
Student-t intervals (:class:`Stat`, in the metric's own units: ``rel_err`` and
``loss_rel_err`` dimensionless, gradient norms in loss units per parameter unit, losses in
nats per token). Rows with ``finite: false`` are counted and never averaged; NaN values of
finite rows (undefined ratios) are left out of their metric's mean and counted. Paired
differences use the batches where both policies are finite. :func:`fmt` and
:func:`fmt_stat` format numbers and :class:`Stat` for tables and text.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
import dataclasses
import math
from typing import Any

import numpy as np

from fp8jax.study.results import Results, row_key

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30; 1.96 beyond.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile(df: int) -> float:
  """The 97.5% quantile of Student's t with ``df`` degrees of freedom (1.96 past 30)."""
  if df < 1:
    raise ValueError(f"df must be >= 1, got {df}")
  return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclasses.dataclass(frozen=True)
class Stat:
  """Mean of ``n`` values with its 95% t-interval [lo, hi] (NaN when n < 2; mean NaN when
  n == 0); ``n_nonfinite`` rows were excluded as non-finite, ``n_undefined`` NaN values."""

  mean: float
  lo: float
  hi: float
  n: int
  n_nonfinite: int = 0
  n_undefined: int = 0

  @property
  def has_ci(self) -> bool:
    return self.n >= 2 and math.isfinite(self.lo)


def mean_ci(values: Iterable[float], n_nonfinite: int = 0) -> Stat:
  """Mean and 95% t-interval (mean +- t_{0.975, n-1} s / sqrt(n), s with ddof 1); NaN
  values are left out and counted as undefined."""
  x = np.asarray(list(values), np.float64)
  ok = x[~np.isnan(x)]
  n, undefined = int(ok.size), int(x.size - ok.size)
  if n == 0:
    return Stat(math.nan, math.nan, math.nan, 0, n_nonfinite, undefined)
  mean = float(ok.mean())
  if n == 1:
    return Stat(mean, math.nan, math.nan, 1, n_nonfinite, undefined)
  half = t_quantile(n - 1) * float(ok.std(ddof=1)) / math.sqrt(n)
  return Stat(mean, mean - half, mean + half, n, n_nonfinite, undefined)


def stat(res: Results, metric: str, policy: str, steps: Iterable[int] | None = None) -> Stat:
  """Mean of ``metric`` over the finite rows of ``policy`` at ``steps`` (default: all)."""
  rows = res.rows_of(policy, steps)
  return mean_ci([float(r.get(metric, math.nan)) for r in rows if r["finite"]],
                 sum(not r["finite"] for r in rows))


def summary(res: Results, metric: str, policies: Sequence[str] | None = None
            ) -> dict[tuple[str, int], Stat]:
  """``{(policy, step): Stat}``: the mean over batches of ``metric`` per checkpoint."""
  return {(p, s): stat(res, metric, p, [s]) for p in (policies or res.policies)
          for s in res.steps}


def paired_diff(res: Results, metric: str, a: str, b: str,
                steps: Iterable[int] | None = None) -> Stat:
  """Mean of ``metric(a) - metric(b)`` over the batches where both rows are finite."""
  rb = {row_key({**r, "policy": None}): r for r in res.rows_of(b, steps) if r["finite"]}
  return mean_ci([float(r.get(metric, math.nan)) - float(rb[k].get(metric, math.nan))
                  for r in res.rows_of(a, steps)
                  if r["finite"] and (k := row_key({**r, "policy": None})) in rb])


def _overlap(x: Stat, y: Stat) -> bool | None:
  if not (x.has_ci and y.has_ci):
    return None
  return x.lo <= y.hi and y.lo <= x.hi


def _excludes_zero(d: Stat) -> bool:
  return d.has_ci and (d.lo > 0 or d.hi < 0)


def compare(res: Results, a: str, b: str, metric: str = "rel_err") -> dict[str, Any]:
  """Policy ``a`` against ``b`` on ``metric``: pooled means (all checkpoints and batches),
  their ratio a/b, the paired difference a - b, and per checkpoint the two means, whether
  their CIs overlap and whether the paired difference's CI excludes 0."""
  per_step = []
  for s in res.steps:
    sa, sb = stat(res, metric, a, [s]), stat(res, metric, b, [s])
    if sa.n and sb.n:
      d = paired_diff(res, metric, a, b, [s])
      per_step.append({"step": s, "a": sa, "b": sb, "diff": d, "overlap": _overlap(sa, sb),
                       "diff_nonzero": _excludes_zero(d)})
  pa, pb = stat(res, metric, a), stat(res, metric, b)
  d = paired_diff(res, metric, a, b)
  return {"a": a, "b": b, "metric": metric, "pooled_a": pa, "pooled_b": pb,
          "ratio": pa.mean / pb.mean if pb.mean else math.nan, "diff": d,
          "diff_nonzero": _excludes_zero(d), "overlap": _overlap(pa, pb), "per_step": per_step,
          "steps_a_lower": sum(x["a"].mean < x["b"].mean for x in per_step),
          "steps_overlap": sum(bool(x["overlap"]) for x in per_step),
          "steps_diff_nonzero": sum(x["diff_nonzero"] for x in per_step)}


DECAYING, PERSISTENT, GROWING = "early-strong/later-decaying", "bounded persistent", "growing"


def trajectory(res: Results, policy: str, metric: str = "rel_err", decay: float = 0.5,
               growth: float = 2.0) -> dict[str, Any]:
  """Shape of a policy's trajectory: the mean over the first third of the checkpoints
  (at least one) against the last third. late/early < ``decay``: :data:`DECAYING`; above
  ``growth``: :data:`GROWING`; otherwise :data:`PERSISTENT`."""
  steps = [s for s in res.steps if stat(res, metric, policy, [s]).n]
  if len(steps) < 2:
    return {"shape": None, "reason": "fewer than 2 checkpoints with finite rows"}
  n = max(1, len(steps) // 3)
  early, late = stat(res, metric, policy, steps[:n]), stat(res, metric, policy, steps[-n:])
  ratio = late.mean / early.mean if early.mean > 0 else math.inf
  shape = DECAYING if ratio < decay else GROWING if ratio > growth else PERSISTENT
  return {"shape": shape, "early": early, "late": late, "ratio": ratio,
          "early_steps": steps[:n], "late_steps": steps[-n:]}


def mean_details(res: Results, policy: str, step: int, field: str = "per_param"
                 ) -> dict[str, float]:
  """``{key: mean over the finite batches}`` of a details field (``per_param`` or
  ``module_layer`` diff_norm) at one checkpoint; NaN entries are left out."""
  acc = defaultdict(list)
  for d in res.details_of(policy, step):
    for k, v in d.get(field, {}).items():
      if v is not None and not math.isnan(float(v)):
        acc[k].append(float(v))
  return {k: float(np.mean(v)) for k, v in acc.items()}


def fmt(v: float | None) -> str:
  """A number with 3 significant digits ("n/a" for None and non-finite values)."""
  return "n/a" if v is None or not math.isfinite(v) else f"{v:.3g}"


def fmt_stat(s: Stat, n: bool = True) -> str:
  """``mean [lo, hi] (n=..)``; without the interval when there is none."""
  if not s.n:
    return "n/a"
  ci = f" [{fmt(s.lo)}, {fmt(s.hi)}]" if s.has_ci else ""
  return fmt(s.mean) + ci + (f" (n={s.n})" if n else "")
