"""Conditioning per checkpoint: how sensitive a checkpoint's gradient is to any perturbation.

Signals per checkpoint (:func:`per_checkpoint`, :data:`SIGNALS`): from ``baseline.jsonl``
the reference's loss (nats per token, arithmetic mean over the batches) and gradient norm
(loss units per parameter unit, geometric mean); when the sweep has a noise floor
(:attr:`~fp8jax.study.common.results.Results.floor`), the floor's relative gradient error
(dimensionless) and its curvature signal ``curvature`` = diff_norm / perturbation_norm (the
norm of a Hessian-vector product along the random perturbation; geometric means).

A checkpoint is *flagged* (:func:`flags`) when its gradient norm, floor rel_err or curvature
is more than :data:`SPIKE_FACTOR` times the median of that signal over the checkpoints: a
loss spike or an unusually sensitive checkpoint, where every policy's error grows with the
checkpoint rather than with the format. :func:`flag_note` says whether the result of a set
of comparisons changes when the flagged checkpoints are left out.

The block-scale telemetry of the GEMM recipes' forward operands (``tel/<stat>`` fields of
the rows, :data:`TELEMETRY`) is summarized per policy by :func:`telemetry`.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

import numpy as np

from fp8jax.study.common import metric_registry, stats
from fp8jax.study.common.results import Results
from fp8jax.study.common.stats import Stat, ci, fmt, fmt_stat, table

SPIKE_FACTOR = 3.0
"""A checkpoint whose flag signal exceeds this multiple of the signal's median is flagged."""
SIGNALS = metric_registry.signals()
"""Conditioning signal -> description (:mod:`fp8jax.study.common.metric_registry`)."""
FLAG_SIGNALS = metric_registry.flag_signals()
"""The signals that flag a checkpoint."""
TELEMETRY = metric_registry.telemetry()
"""Telemetry field (``tel/<name>``) -> description (fractions of blocks, kurtosis, log2)."""


def _baseline(res: Results, step: int, key: str) -> np.ndarray:
  return np.array([float(b.get(key, math.nan)) for b in res.baseline
                   if int(b["step"]) == step and b.get("finite", True)], np.float64)


def per_checkpoint(res: Results) -> dict[int, dict[str, Stat]]:
  """``{step: {signal: Stat over the batches}}`` of :data:`SIGNALS` (the floor's only when
  the sweep has one)."""
  out = {}
  for s in res.steps:
    sig = {"loss": ci(_baseline(res, s, "loss"), False),
           "grad_norm": ci(_baseline(res, s, "grad_norm"), True)}
    if res.floor:
      sig["floor_rel_err"] = stats.stat(res, "rel_err", res.floor, [s])
      sig["curvature"] = stats.stat(res, "curvature", res.floor, [s])
    out[s] = sig
  return out


def flags(res: Results, factor: float = SPIKE_FACTOR,
          signals: dict[int, dict[str, Stat]] | None = None) -> dict[int, list[str]]:
  """``{step: [reasons]}`` of the flagged checkpoints: a signal of :data:`FLAG_SIGNALS`
  whose center exceeds ``factor`` times its median over the checkpoints."""
  signals = per_checkpoint(res) if signals is None else signals
  out: dict[int, list[str]] = {}
  for name in FLAG_SIGNALS:
    centers = {s: sig[name].center for s, sig in signals.items()
               if name in sig and math.isfinite(sig[name].center)}
    if len(centers) < 3:  # with 2 values neither exceeds 3x their median
      continue
    med = float(np.median(list(centers.values())))
    for s, v in centers.items():
      if med > 0 and v > factor * med:
        out.setdefault(s, []).append(f"{name} {fmt(v)} = {fmt(v / med)}x the median "
                                     f"{fmt(med)}")
  return dict(sorted(out.items()))


def _outcome(c: dict) -> tuple[int, bool]:
  """(side of the null the paired comparison lies on, whether its interval excludes it)."""
  d = c["ratio"] - 1 if c["log"] else c["paired"].center
  return (0 if not math.isfinite(d) else int(np.sign(d))), c["excludes_null"]


def flag_note(res: Results, comps: Sequence[tuple[str, dict]], flagged: Sequence[int]
              ) -> str:
  """A sentence on whether ``comps`` (``(label, stats.compare(...))``) change when the
  flagged checkpoints are left out (the side of the null, or whether the paired interval
  excludes it); "" without flagged checkpoints among the compared ones."""
  if not comps:
    return ""
  steps = comps[0][1]["steps"]
  out = [s for s in steps if s in set(flagged)]
  keep = [s for s in steps if s not in set(flagged)]
  if not out:
    return ""
  many = len(out) > 1
  head = f"Flagged checkpoint{'s' if many else ''} {', '.join(map(str, out))}"
  if not keep:
    return head + ": every compared checkpoint is flagged (conditioning, not format)."
  changed = []
  for label, c in comps:
    d = stats.compare(res, c["a"], c["b"], c["metric"], keep)
    if _outcome(d) != _outcome(c):
      what = "ratio" if c["log"] else "difference"
      changed.append(f"{label}: {what} {fmt(c['ratio'] if c['log'] else c['paired'].center)}"
                     f" -> {fmt(d['ratio'] if d['log'] else d['paired'].center)}")
  if changed:
    return (head + f" {'drive' if many else 'drives'} the result: without "
            f"{'them' if many else 'it'} the result changes in {len(changed)} of "
            f"{len(comps)} comparisons ({'; '.join(changed)}).")
  return (head + f": without {'them' if many else 'it'} every one of the {len(comps)} "
          "comparisons keeps its side and its significance.")


def telemetry(res: Results) -> dict[str, dict[str, Any]]:
  """``{policy: {field: Summary over the checkpoints}}`` of the policies whose rows hold
  ``tel/<field>`` values (:data:`TELEMETRY`), the fields with a value that is not NaN (a
  scale rule's share where no operand uses the rule is NaN)."""
  out = {}
  for p in res.policies:
    present = {k for r in res.rows_of(p) for k, v in r.items()
               if not (isinstance(v, float) and math.isnan(v))}
    fields = [f for f in TELEMETRY if f"tel/{f}" in present]
    if fields:
      out[p] = {f: stats.overall(res, f"tel/{f}", p) for f in fields}
  return out


def markdown(res: Results, signals: dict[int, dict[str, Stat]] | None = None,
             flagged: dict[int, list[str]] | None = None) -> list[str]:
  """The report section: conditioning per checkpoint, flags and telemetry."""
  signals = per_checkpoint(res) if signals is None else signals
  flagged = flags(res, signals=signals) if flagged is None else flagged
  lines = ["## Conditioning per checkpoint", ""]
  if res.floor:
    lines += [f"The noise floor (`{res.floor}`) is the {res.reference} reference's gradient "
              "at weights perturbed at BF16 rounding level, w (1 + 2^-8 U(-1, 1)), against "
              "its gradient at the checkpoint's weights on the same batch; its curvature is "
              "diff_norm / perturbation_norm, the norm of a Hessian-vector product along the "
              "perturbation.", ""]
  else:
    lines += ["This sweep has no noise floor (written without one): no metric of this report "
              "can be read against the checkpoint's own sensitivity, and only the gradient "
              "norm flags checkpoints.", ""]
  lines += [f"Geometric means [95% CI] over the batches (the loss: arithmetic mean). A "
            f"checkpoint is flagged when its gradient norm, floor rel_err or curvature exceeds "
            f"{SPIKE_FACTOR:g}x the median over the checkpoints (a spike, or a checkpoint more "
            "sensitive to any perturbation); the answers say when a flagged checkpoint "
            "drives a result.", ""]
  names = [k for k in SIGNALS if any(k in sig for sig in signals.values())]
  rows = [[s, *(fmt_stat(sig[k], n=False) for k in names),
           "; ".join(flagged.get(s, [])) or "no"] for s, sig in signals.items()]
  lines += table(["step", *(SIGNALS[k] for k in names), "flagged"], rows)
  tel = telemetry(res)
  if tel:
    fields = [f for f in TELEMETRY if any(f in t for t in tel.values())]
    lines += ["Block-scale telemetry of the GEMM recipes' forward operands (median over the "
              "checkpoints [95% bootstrap CI over the batches]):", ""]
    lines += table(["policy", *fields],
                    [[p, *(fmt_stat(t[f], n=False) if f in t else "n/a" for f in fields)]
                     for p, t in tel.items()])
  return lines
