"""Statistics over a loaded sweep (:class:`fp8jax.study.common.results.Results`).

Per checkpoint (:func:`stat`, :class:`~fp8jax.study.common.intervals.Stat`): the center of a metric
over the evaluation batches with its 95% interval; positive metrics (:func:`is_positive`:
norms, relative errors, their ratios) on the log scale (geometric mean, t-interval of the
logs), signed ones (cosines, shares, fractions) as arithmetic means with t-intervals; each
metric's scale is registered in :mod:`fp8jax.study.common.metric_registry`.
Across checkpoints (:func:`overall`, :class:`~fp8jax.study.common.intervals.Summary`): the median
of the per-checkpoint centers with a 95% bootstrap interval that resamples the batches
within each checkpoint (fixed seed). Paired comparisons of two policies (:func:`paired`,
:func:`compare`) use the batches where both rows are finite: the per-batch ratio a / b for
positive metrics, the difference a - b otherwise, summarized the same way.

Units are the metric's own (``rel_err`` and ``loss_rel_err`` dimensionless, gradient norms
in loss units per parameter unit, losses in nats per token). Rows with ``finite: false`` are
counted and never averaged; NaN values of finite rows (undefined ratios) are left out and
counted. :func:`fmt` and :func:`fmt_stat` format numbers, Stats and Summaries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
import math
from typing import Any

import numpy as np

from fp8jax.study.common import metric_registry
from fp8jax.study.common.intervals import (
  Stat,
  Summary,
  ci,
  log_ci,
  mean_ci,
  median_boot,
  t_quantile,
)
from fp8jax.study.common.results import Results, row_key

__all__ = ["Stat", "Summary", "ci", "compare", "fmt", "fmt_stat", "is_positive", "log_ci",
           "mean_ci", "mean_details", "overall", "paired", "paired_values", "stat", "summary",
           "t_quantile", "table", "trajectory", "values"]

POSITIVE = metric_registry.positive_names()
"""Metric names (the last ``/`` component) that are positive: summarized on the log scale."""
N_BOOT = 2000
"""Bootstrap resamples of the summaries across checkpoints (seed 0)."""


def is_positive(metric: str) -> bool:
  """Whether a metric is a positive quantity (``module/attn_o/rel_err`` is, like
  ``rel_err``; ``cosine``, ``share_direct`` and routing fractions are not).

  Raises:
    KeyError: the metric is not registered (:mod:`fp8jax.study.common.metric_registry`).
  """
  return metric_registry.is_positive(metric)


def values(res: Results, metric: str, policy: str, step: int) -> tuple[np.ndarray, int]:
  """``(values of the finite rows (NaN where absent), number of non-finite rows)`` of one
  policy at one checkpoint."""
  rows = res.rows_of(policy, [step])
  x = np.array([float(r.get(metric, math.nan)) for r in rows if r["finite"]], np.float64)
  return x, sum(not r["finite"] for r in rows)


def stat(res: Results, metric: str, policy: str, steps: Iterable[int] | None = None,
         log: bool | None = None) -> Stat:
  """The center and 95% interval of ``metric`` over the finite rows of ``policy`` at
  ``steps`` (default: all, pooled); ``log`` defaults to :func:`is_positive`."""
  got = [values(res, metric, policy, s) for s in (res.steps if steps is None else steps)]
  x = np.concatenate([v for v, _ in got] or [np.zeros(0)])
  return ci(x, is_positive(metric) if log is None else log, sum(k for _, k in got))


def summary(res: Results, metric: str, policies: Iterable[str] | None = None
            ) -> dict[tuple[str, int], Stat]:
  """``{(policy, step): Stat}``: ``metric`` over the batches of each checkpoint."""
  return {(p, s): stat(res, metric, p, [s]) for p in (policies or res.policies)
          for s in res.steps}


def overall(res: Results, metric: str, policy: str, steps: Iterable[int] | None = None,
            n_boot: int = N_BOOT, seed: int = 0) -> Summary:
  """The median over the checkpoints of ``metric``'s per-checkpoint center, with a 95%
  bootstrap interval over the batches (:func:`~fp8jax.study.common.intervals.median_boot`)."""
  got = [values(res, metric, policy, s) for s in (res.steps if steps is None else steps)]
  return median_boot([v for v, _ in got], is_positive(metric), n_boot, seed,
                     sum(k for _, k in got))


def paired_values(res: Results, metric: str, a: str, b: str, step: int,
                  log: bool | None = None) -> np.ndarray:
  """Per batch of one checkpoint where both rows are finite: ``metric(a) / metric(b)``
  (when ``log``, default :func:`is_positive`; NaN where b is not positive) or
  ``metric(a) - metric(b)``."""
  log = is_positive(metric) if log is None else log
  rb = {row_key({**r, "policy": None}): float(r.get(metric, math.nan))
        for r in res.rows_of(b, [step]) if r["finite"]}
  out = []
  for r in res.rows_of(a, [step]):
    k = row_key({**r, "policy": None})
    if r["finite"] and k in rb:
      x, y = float(r.get(metric, math.nan)), rb[k]
      out.append((x / y if y > 0 else math.nan) if log else x - y)
  return np.asarray(out, np.float64)


def paired(res: Results, metric: str, a: str, b: str, steps: Iterable[int] | None = None,
           log: bool | None = None, n_boot: int = N_BOOT, seed: int = 0
           ) -> tuple[dict[int, Stat], Summary]:
  """``({step: Stat}, Summary)`` of the paired ratio a / b (positive metrics) or difference
  a - b: per checkpoint over its batches, and the median over the checkpoints."""
  log = is_positive(metric) if log is None else log
  steps = res.steps if steps is None else list(steps)
  per = {s: paired_values(res, metric, a, b, s, log) for s in steps}
  return ({s: ci(v, log) for s, v in per.items()},
          median_boot(list(per.values()), log, n_boot, seed))


def _overlap(x, y) -> bool | None:
  if not (x.has_ci and y.has_ci):
    return None
  return x.lo <= y.hi and y.lo <= x.hi


def excludes(s, null: float) -> bool:
  """Whether an interval (Stat or Summary) excludes ``null``."""
  return bool(s.has_ci and (s.lo > null or s.hi < null))


def compare(res: Results, a: str, b: str, metric: str = "rel_err",
            steps: Iterable[int] | None = None) -> dict[str, Any]:
  """Policy ``a`` against ``b`` on ``metric`` at ``steps`` (default: all).

  Returns ``summary_a``/``summary_b`` (medians over the checkpoints, bootstrap intervals),
  ``paired`` (the Summary of the paired ratio a / b, or difference a - b for a signed
  metric; ``log`` says which, ``null`` is 1 or 0), ``ratio`` (the paired ratio's median; for
  a signed metric the ratio of the medians), ``excludes_null`` (the paired interval excludes
  the null), ``overlap`` (of the two summaries' intervals) and ``per_step`` (the two Stats,
  the paired Stat, overlap, excludes_null per checkpoint), with counts over the checkpoints.
  """
  steps = res.steps if steps is None else list(steps)
  log = is_positive(metric)
  null = 1.0 if log else 0.0
  per_paired, summ = paired(res, metric, a, b, steps, log)
  per_step = []
  for s in steps:
    sa, sb = stat(res, metric, a, [s]), stat(res, metric, b, [s])
    if sa.n and sb.n:
      d = per_paired[s]
      per_step.append({"step": s, "a": sa, "b": sb, "paired": d, "overlap": _overlap(sa, sb),
                       "excludes_null": excludes(d, null)})
  oa, ob = overall(res, metric, a, steps), overall(res, metric, b, steps)
  ratio = summ.median if log else (oa.median / ob.median if ob.median else math.nan)
  return {"a": a, "b": b, "metric": metric, "log": log, "null": null, "summary_a": oa,
          "summary_b": ob, "paired": summ, "ratio": ratio,
          "excludes_null": excludes(summ, null), "overlap": _overlap(oa, ob),
          "per_step": per_step, "steps": steps,
          "steps_a_lower": sum(x["a"].mean < x["b"].mean for x in per_step),
          "steps_overlap": sum(bool(x["overlap"]) for x in per_step),
          "steps_excludes_null": sum(x["excludes_null"] for x in per_step)}


DECAYING, PERSISTENT, GROWING = "early-strong/later-decaying", "bounded persistent", "growing"


def trajectory(res: Results, policy: str, metric: str = "rel_err", decay: float = 0.5,
               growth: float = 2.0) -> dict[str, Any]:
  """Shape of a policy's trajectory: the center (geometric mean for a positive metric) over
  the first third of the checkpoints (at least one) against the last third. late/early <
  ``decay``: :data:`DECAYING`; above ``growth``: :data:`GROWING`; otherwise
  :data:`PERSISTENT`."""
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


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
  """A markdown table (lines, ending with a blank line)."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]


def fmt(v: float | None) -> str:
  """A number with 3 significant digits ("n/a" for None and non-finite values)."""
  return "n/a" if v is None or not math.isfinite(v) else f"{v:.3g}"


def fmt_stat(s: Stat | Summary, n: bool = True) -> str:
  """``center [lo, hi] (n=..)``; without the interval when there is none."""
  if not s.n:
    return "n/a"
  ci_text = f" [{fmt(s.lo)}, {fmt(s.hi)}]" if s.has_ci else ""
  return fmt(s.center) + ci_text + (f" (n={s.n})" if n else "")
