"""Every policy against two yardsticks: the noise floor and its noise-matched control.

*Floor multiples* (:func:`multiples`): a policy's metric divided by the noise floor's on
the same (checkpoint, offset, batch); per checkpoint the geometric mean of these multiples
with the t-interval of their logs, overall the median over the checkpoints with a bootstrap
interval over the batches (:mod:`fp8jax.study.common.stats`). A policy whose multiple's interval
reaches down to :data:`FLOOR_MULTIPLE` times the floor cannot be told apart from the
checkpoint's own sensitivity to any perturbation of BF16 rounding size.

*Controls* (:func:`control`): the paired ratio of a policy's metric to its noise-matched
control's (``noise(<policy>)``: each quantization error replaced by unbiased random noise
of the same energy per block) on the same batches. Below 1 with its interval, the
quantization error perturbs the gradient less than random noise of its size; above 1, more;
an interval containing 1 cannot tell.
"""

from __future__ import annotations

from typing import Any

from fp8jax.study.common import metric_registry, stats
from fp8jax.study.common.results import Results
from fp8jax.study.common.stats import fmt, fmt_stat, table

FLOOR_MULTIPLE = 3.0
"""A policy is distinguishable from the floor when its multiple's lower bound exceeds this."""
FLOOR_METRICS = metric_registry.floor_names()
"""Metrics reported as multiples of the floor's (those registered with ``floor``)."""
CANNOT_TELL = "cannot tell from the checkpoint's own sensitivity"


def _interval(s) -> str:
  return f"[{fmt(s.lo)}, {fmt(s.hi)}]" if s.has_ci else "(no interval)"


def within(s, factor: float = FLOOR_MULTIPLE) -> bool:
  """Whether a floor multiple (Stat or Summary) reaches down to ``factor``: its lower bound,
  or its center without an interval, is at most ``factor``."""
  return (s.lo if s.has_ci else s.center) <= factor


def multiples(res: Results, policy: str, metric: str = "rel_err",
              factor: float = FLOOR_MULTIPLE) -> dict[str, Any]:
  """``policy``'s ``metric`` as a multiple of the floor's: ``per_step`` {step: Stat},
  ``overall`` (Summary), ``steps_within`` (checkpoints reaching down to ``factor``),
  ``within`` and a ``sentence``; ``available: False`` without a floor."""
  if not res.floor:
    return {"available": False, "policy": policy, "metric": metric}
  per, summ = stats.paired(res, metric, policy, res.floor, log=True)
  per = {s: st for s, st in per.items() if st.n}
  steps_within = [s for s, st in per.items() if within(st, factor)]
  name = f"{policy}: {metric} {fmt(summ.center)}x the floor {_interval(summ)}"
  listed = f": {', '.join(map(str, steps_within))}" if steps_within else ""
  per_text = f"{len(steps_within)} of {len(per)} checkpoints within {factor:g}x{listed}"
  if not summ.n:
    sentence = f"{policy}: no batch shared with the floor."
  elif summ.center <= factor:
    sentence = f"{name}, within {factor:g}x the floor: {CANNOT_TELL} ({per_text})."
  elif within(summ, factor):
    sentence = (f"{name}, its interval reaching down to {factor:g}x the floor: {CANNOT_TELL} "
                f"({per_text}).")
  else:
    sentence = (f"{name}, above {factor:g}x the floor: larger than the checkpoint's own "
                f"sensitivity ({per_text}).")
  return {"available": True, "policy": policy, "metric": metric, "per_step": per,
          "overall": summ, "steps_within": steps_within, "within": within(summ, factor),
          "sentence": sentence}


def control(res: Results, policy: str, metric: str = "rel_err") -> dict[str, Any]:
  """``policy`` against its noise-matched control: ``per_step`` {step: Stat of the paired
  ratio}, ``overall`` (Summary), ``verdict`` ("less than noise", "more than noise" or
  "cannot tell") and a ``sentence``; ``available: False`` without a control."""
  ctrl = res.control_for(policy)
  if ctrl is None:
    return {"available": False, "policy": policy, "metric": metric}
  per, summ = stats.paired(res, metric, policy, ctrl, log=True)
  head = (f"{policy}: {metric} / its noise-matched control's = {fmt(summ.center)} "
          f"{_interval(summ)}")
  if summ.has_ci and summ.hi < 1:
    verdict, text = "less than noise", ("the quantization error perturbs the gradient less "
                                        "than random noise of the same size")
  elif summ.has_ci and summ.lo > 1:
    verdict, text = "more than noise", ("the quantization error perturbs the gradient more "
                                        "than random noise of the same size")
  else:
    verdict = "cannot tell"
    text = ("cannot tell (the interval contains 1)" if summ.has_ci
            else "cannot tell (no interval)")
  return {"available": True, "policy": policy, "control": ctrl, "metric": metric,
          "per_step": {s: st for s, st in per.items() if st.n}, "overall": summ,
          "verdict": verdict, "sentence": f"{head}: {text}."}


def floor_markdown(res: Results, factor: float = FLOOR_MULTIPLE) -> list[str]:
  """The report section on the floor multiples (a note without a floor)."""
  lines = ["## Against the noise floor", ""]
  if not res.floor:
    return lines + ["Not available: this sweep has no noise floor, so no policy can be "
                    "told apart from the checkpoint's own sensitivity.", ""]
  lines += [f"Each policy's metric divided by the floor's on the same (checkpoint, batch): "
            "per checkpoint the geometric mean [95% t-interval of the logs], overall the "
            "median over the checkpoints [95% bootstrap interval over the batches]. A "
            f"multiple whose interval reaches down to {factor:g}x the floor: {CANNOT_TELL}.",
            ""]
  names = res.policies + list(res.controls)
  per = {p: {m: multiples(res, p, m, factor) for m in FLOOR_METRICS} for p in names}
  lines += [f"- {per[p]['rel_err']['sentence']}" for p in res.policies] + [""]
  rows = []
  for p in names:
    r = per[p]["rel_err"]
    rows.append([p, res.kind(p), *(fmt_stat(per[p][m]["overall"], n=False)
                                   for m in FLOOR_METRICS),
                 *(fmt_stat(r["per_step"][s], n=False) if s in r["per_step"] else "n/a"
                   for s in res.steps), "yes" if r["within"] else "no"])
  return lines + table(["policy", "kind", *(f"{m} / floor" for m in FLOOR_METRICS),
                         *(f"rel_err / floor @{s}" for s in res.steps),
                         f"within {factor:g}x"], rows)


def controls_markdown(res: Results) -> list[str]:
  """The report section on the noise-matched controls ([] without any)."""
  found = [control(res, b) for b in dict.fromkeys(res.controls.values())]
  found = [c for c in found if c["available"]]
  if not found:
    return []
  lines = ["## Against noise-matched controls", "",
           "Is the quantization error worse or better for the gradient than unbiased random "
           "noise of the same energy per block? The paired ratio policy / control of rel_err "
           "on the same batches: per checkpoint the geometric mean [95% t-interval of the "
           "logs], overall the median over the checkpoints [95% bootstrap interval]; "
           "'cannot tell' when the interval contains 1.", ""]
  lines += [f"- {c['sentence']}" for c in found] + [""]
  rows = [[c["policy"], c["control"], fmt_stat(c["overall"], n=False),
           *(fmt_stat(c["per_step"][s], n=False) if s in c["per_step"] else "n/a"
             for s in res.steps), c["verdict"]] for c in found]
  return lines + table(["policy", "control", "policy / control",
                         *(f"@{s}" for s in res.steps), "verdict"], rows)
