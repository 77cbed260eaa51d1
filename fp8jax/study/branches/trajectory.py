"""Does the one-step perturbation predict the trajectory? (issue 16, item 2)

The branch-off study continues training from baseline checkpoints for K steps under BF16,
under noise-floor BF16 branches (weights perturbed at bf16 rounding level) and under each
policy, and writes ``meta.json`` and ``branches.jsonl`` (one line per (from_step, branch)).
:func:`load_branches` reads it (a torn last line, left by a killed writer, is dropped; a
later duplicate (from_step, branch) line replaces an earlier one).

Outcomes per (from_step, branch) (:func:`outcomes`; :data:`OUTCOMES`): ``loss_gap``, the
mean relative loss gap to the BF16 branch over the last ``tail`` steps (dimensionless,
default tail max(1, K // 4)); ``param_div``, ||theta - theta_bf16|| / ||theta_bf16|| after
update K; ``update_cos``, the mean cosine of the updates with the BF16 branch's;
``routing_div``, the fraction of tokens whose top-k set differs at step K; ``growth_rate``,
the slope of log(param_div) per step. Steps marked non-finite are left out and counted; a
value at K is NaN when step K is non-finite. The noise floor of a checkpoint
(:func:`noise_floor`) is the noise branches' most divergent outcome; a policy outcome is
*above the floor* when it is further from BF16 than that (|loss_gap| > floor, cosine below).

Predictors per (checkpoint step, policy) come from the comparison sweep (:func:`predictors`:
means over the finite evaluation rows of ``rel_err``, ``share_direct`` and the routing
divergence, :data:`PREDICTORS`; when the sweep has them, :data:`EXTRA_PREDICTORS`: the
rel_err as a multiple of the noise floor, the checkpoint's conditioning signals
(:mod:`fp8jax.study.comparison.conditioning`) and the block-scale telemetry of the GEMM recipes).
:func:`study` joins both on (step == from_step, policy), and gives each predictor x outcome
pair a Spearman correlation with a percentile bootstrap 95% CI over the pairs, a
permutation p-value (fixed seeds), the mean within-checkpoint Spearman correlation and a
verdict sentence; a relation is stated only when its Holm-adjusted p-value over all the
pairs tested is below 0.05 (:mod:`fp8jax.study.common.correlation`). :func:`markdown` renders the
report section.
"""

from __future__ import annotations

from collections import defaultdict
import dataclasses
import math
import pathlib
import re
from typing import Any

import numpy as np

from fp8jax.study.common import metric_registry, results, results_io, stats
from fp8jax.study.common.correlation import adjust, correlate, fmt_p, related
from fp8jax.study.common.results import Results
from fp8jax.study.common.stats import fmt, table
from fp8jax.study.comparison import conditioning

__all__ = ["Branches", "EXTRA_PREDICTORS", "OUTCOMES", "PREDICTORS", "TITLE", "above_floor",
           "correlate", "floor_summary", "load_branches", "markdown", "noise_floor", "outcome",
           "outcomes", "predictors", "study", "tail_len", "verdict"]

TITLE = "Does the one-step perturbation predict the trajectory?"
KINDS = ("reference", "noise", "policy")
OUTCOMES = metric_registry.outcomes()
"""Outcome name -> description (all dimensionless; growth_rate in 1/step)."""
FLOOR_SIGN = {"param_div": 1, "loss_gap": 1, "routing_div": 1, "update_cos": -1}
"""Outcomes with a noise floor: +1 larger is further from BF16 (loss_gap by |value|), -1
smaller is."""
PREDICTORS = metric_registry.predictors()
"""Predictor name -> description (dimensionless); always tested."""
EXTRA_PREDICTORS = metric_registry.predictors(extra=True)
"""Predictors tested when the sweep has them (conditioning signals are per checkpoint)."""
_NEED = ("from_step", "branch", "kind", "steps", "finite")
_SERIES = ("loss_rel_gap", "param_div", "update_cos", "routing_diff", "finite")
_ROUTING = re.compile(r"^routing/\d+/topk_set_diff_frac$")


@dataclasses.dataclass
class Branches:
  """A loaded branch-off study: ``meta`` and the (deduplicated) lines."""

  folder: pathlib.Path
  meta: dict
  lines: list[dict]

  @property
  def k(self) -> int:
    """Steps per branch (meta ``k``, else the longest line)."""
    return int(self.meta.get("k") or max((len(x["steps"]) for x in self.lines), default=0))

  @property
  def from_steps(self) -> list[int]:
    """Checkpoint steps with at least one branch, ascending."""
    return sorted({int(x["from_step"]) for x in self.lines})

  def of_kind(self, kind: str) -> list[dict]:
    """The lines of one kind ("reference", "noise" or "policy")."""
    return [x for x in self.lines if x["kind"] == kind]


def load_branches(folder: str | pathlib.Path) -> Branches:
  """Reads ``meta.json`` and ``branches.jsonl`` of a branch folder.

  Raises:
    FileNotFoundError: a file is missing (named in the message).
    ValueError: a line (other than a torn last one) is not a JSON object, lacks a key, has
      an unknown kind or a series whose length differs from ``steps`` (``file:line``).
  """
  folder = pathlib.Path(folder)
  for name in ("meta.json", "branches.jsonl"):
    if not (folder / name).exists():
      raise FileNotFoundError(f"branch file {name} not found in {folder}")
  meta = results_io.read_meta(folder / "meta.json")
  path = folder / "branches.jsonl"
  by: dict[tuple[int, str], dict] = {}
  for i, obj in results.numbered_jsonl(path):
    missing = [k for k in _NEED if k not in obj]
    if missing:
      raise ValueError(f"{path}:{i}: lacks {missing}")
    if obj["kind"] not in KINDS:
      raise ValueError(f"{path}:{i}: kind {obj['kind']!r} is not one of {KINDS}")
    for key in _SERIES:
      if obj.get(key) is not None and len(obj[key]) != len(obj["steps"]):
        raise ValueError(f"{path}:{i}: {key} has {len(obj[key])} entries, steps "
                         f"{len(obj['steps'])}")
    by[(int(obj["from_step"]), obj["branch"])] = obj
  order = sorted(by, key=lambda k: (k[0], KINDS.index(by[k]["kind"]), k[1]))
  return Branches(folder, meta, [by[k] for k in order])


def tail_len(k: int) -> int:
  """The default tail of the loss gap: max(1, K // 4) steps."""
  return max(1, k // 4)


def _series(line: dict, key: str) -> np.ndarray:
  """A per-step series as float64, NaN at non-finite steps and null entries."""
  n = len(line["steps"])
  vals = line.get(key) or [None] * n
  x = np.array([math.nan if v is None else float(v) for v in vals], np.float64)
  return np.where(np.asarray(line["finite"], bool), x, math.nan)


def _mean(x: np.ndarray) -> float:
  x = x[np.isfinite(x)]
  return float(x.mean()) if x.size else math.nan


def outcome(line: dict, tail: int | None = None) -> dict[str, Any]:
  """The outcomes of one branch line (:data:`OUTCOMES`), plus ``n_steps``, ``n_nonfinite``
  (steps left out) and ``nonfinite`` (the writer's message)."""
  n = len(line["steps"])
  t = tail_len(n) if tail is None else max(1, min(int(tail), n))
  gap = _series(line, "loss_rel_gap")
  g = line.get("growth_rate")
  return {"param_div": float(_series(line, "param_div")[-1]) if n else math.nan,
          "loss_gap": _mean(gap[n - t:]), "abs_loss_gap": _mean(np.abs(gap[n - t:])),
          "update_cos": _mean(_series(line, "update_cos")),
          "routing_div": float(_series(line, "routing_diff")[-1]) if n else math.nan,
          "growth_rate": math.nan if g is None else float(g), "n_steps": n,
          "n_nonfinite": int(n - np.sum(np.asarray(line["finite"], bool))),
          "nonfinite": line.get("nonfinite")}


def outcomes(br: Branches, tail: int | None = None) -> dict[tuple[int, str], dict]:
  """``{(from_step, branch): outcome(line) + kind}`` of every line."""
  return {(int(x["from_step"]), x["branch"]): {**outcome(x, tail), "kind": x["kind"]}
          for x in br.lines}


def _distance(name: str, value: float) -> float:
  """How far from BF16 an outcome is, in the direction of :data:`FLOOR_SIGN`."""
  return abs(value) if name == "loss_gap" else FLOOR_SIGN[name] * value


def noise_floor(outs: dict[tuple[int, str], dict]) -> dict[int, dict[str, float]]:
  """``{from_step: {outcome: floor, "n_noise": count}}``: the most divergent noise branch
  (param_div, routing_div: max at K; loss_gap: max tail mean of |relative gap|; update_cos:
  min mean cosine); NaN without a finite noise value."""
  by = defaultdict(list)
  for (s, _), o in outs.items():
    if o["kind"] == "noise":
      by[s].append(o)
  floors = {}
  for s, noise in sorted(by.items()):
    f: dict[str, float] = {"n_noise": len(noise)}
    for name, sign in FLOOR_SIGN.items():
      v = [o["abs_loss_gap" if name == "loss_gap" else name] for o in noise]
      v = [x for x in v if math.isfinite(x)]
      f[name] = (max(v) if sign > 0 else min(v)) if v else math.nan
    floors[s] = f
  return floors


def above_floor(name: str, value: float, floor: float) -> bool | None:
  """Whether an outcome is further from BF16 than its noise floor (None: undefined)."""
  if name not in FLOOR_SIGN or not (math.isfinite(value) and math.isfinite(floor)):
    return None
  return _distance(name, value) > _distance(name, floor)


def predictors(res: Results) -> tuple[dict[tuple[int, str], dict[str, float]], int]:
  """``({(step, policy): {predictor: value}}, rows skipped as non-finite)`` of the policies
  and the noise-matched controls (not the floor): means over the finite rows (routing: each
  row's mean over the MoE layers; NaN where absent), the geometric mean of rel_err / floor
  over the batches, and the checkpoint's conditioning signals (their centers,
  :func:`fp8jax.study.comparison.conditioning.per_checkpoint`)."""
  out, skipped = {}, 0
  signals = conditioning.per_checkpoint(res)
  tel = [k for k in EXTRA_PREDICTORS if k.startswith("tel/")]
  for p in res.policies + list(res.controls):  # the controls can be branched off too
    for s in res.steps:
      acc = defaultdict(list)
      for r in res.rows_of(p, [s]):
        if not r["finite"]:
          skipped += 1
          continue
        layers = [float(v) for k, v in r.items() if _ROUTING.match(k) and v is not None]
        vals = {"rel_err": r.get("rel_err"), "share_direct": r.get("share_direct"),
                "routing": float(np.mean(layers)) if layers else None,
                **{k: r.get(k) for k in tel}}
        for k, v in vals.items():
          if v is not None and math.isfinite(float(v)):
            acc[k].append(float(v))
      d = {k: float(np.mean(acc[k])) if acc[k] else math.nan for k in (*PREDICTORS, *tel)}
      multiple = (stats.paired_values(res, "rel_err", p, res.floor, s, log=True)
                  if res.floor else np.zeros(0))
      multiple = multiple[np.isfinite(multiple) & (multiple > 0)]
      d["floor_multiple"] = float(np.exp(np.log(multiple).mean())) if multiple.size else math.nan
      d.update({k: st.center for k, st in signals[s].items()})
      out[(s, p)] = d
  return out, skipped


def floor_summary(pairs: list[dict], name: str) -> dict[str, int]:
  """``{"above", "n"}``: how many policy branches (with a defined floor) exceed it."""
  flags = [p["above"][name] for p in pairs if p["above"].get(name) is not None]
  return {"above": int(sum(flags)), "n": len(flags)}


def verdict(pred: str, name: str, c: dict, floor: dict | None, min_above: float = 0.5,
            n_tests: int | None = None) -> str:
  """A sentence with the numbers of one predictor x outcome correlation (a relation when its
  Holm-adjusted p-value, over ``n_tests``, is below 0.05); outcomes above their noise floor
  in at most a ``min_above`` fraction of branches are called "not distinguishable from the
  noise floor"."""
  head = f"{pred} vs {name}: "
  if c["reason"]:
    return head + f"not enough data ({c['reason']}; n = {c['n']})."
  excl = f", {c['n_excluded']} excluded as non-finite or undefined" if c["n_excluded"] else ""
  text = (head + f"Spearman rho = {fmt(c['rho'])} (95% CI [{fmt(c['lo'])}, {fmt(c['hi'])}], "
          f"n = {c['n']}{excl})")
  if c["n_groups"]:
    text += (f"; within checkpoints mean rho = {fmt(c['within'])} over {c['n_groups']} "
             "checkpoints")
  family = f" over {n_tests} tests" if n_tests else ""
  p = f"permutation p = {fmt_p(c['p'])}, Holm-adjusted p = {fmt_p(c['p_adj'])}{family}"
  if not math.isfinite(c["p_adj"]):
    text += ". Undetermined (no p-value)."
  elif related(c):
    text += f". A {'positive' if c['rho'] > 0 else 'negative'} relation ({p})."
  else:
    text += f". No evidence of a relation ({p})."
  if floor is not None and name in FLOOR_SIGN:
    a, n = floor["above"], floor["n"]
    if not n:
      text += " No noise floor to compare with."
    elif a <= min_above * n:
      text += (f" The {name} is not distinguishable from the noise floor: above it in {a} "
               f"of {n} policy branches ({100 * a / n:.0f}%).")
    else:
      text += f" Above the noise floor in {a} of {n} policy branches ({100 * a / n:.0f}%)."
  return text


def study(res: Results, br: Branches, tail: int | None = None, n_boot: int = 2000,
          seed: int = 0) -> dict[str, Any]:
  """The whole answer: ``pairs`` (joined (from_step, policy) with predictors, outcomes,
  ``above``), ``floors``, ``floor_counts`` per outcome, ``predictors`` (those tested),
  ``correlations`` {(predictor, outcome): correlate(...) with ``p_adj``, Holm over the
  ``n_tests`` pairs with a p-value}, ``verdicts`` (same keys), ``skipped_rows``, ``unmatched``
  (policy branches without a sweep row), ``nonfinite`` (branches with non-finite steps),
  ``k``, ``tail`` and ``summary``."""
  outs = outcomes(br, tail)
  floors = noise_floor(outs)
  preds, skipped = predictors(res)
  pairs, unmatched = [], []
  for (s, b), o in outs.items():
    if o["kind"] != "policy":
      continue
    if (s, b) not in preds:
      unmatched.append((s, b))
      continue
    f = floors.get(s, {})
    pairs.append({"step": s, "policy": b, **preds[(s, b)], "outcome": o,
                  "above": {k: above_floor(k, o[k], f.get(k, math.nan)) for k in FLOOR_SIGN}})
  counts = {k: floor_summary(pairs, k) for k in FLOOR_SIGN}
  names = list(PREDICTORS) + [p for p in EXTRA_PREDICTORS
                              if any(math.isfinite(x.get(p, math.nan)) for x in pairs)]
  corr = {(p, k): correlate([x.get(p, math.nan) for x in pairs],
                            [x["outcome"][k] for x in pairs], [x["step"] for x in pairs],
                            n_boot, seed)
          for p in names for k in OUTCOMES}
  n_tests = adjust(corr)
  verdicts = {(p, k): verdict(p, k, c, counts.get(k), n_tests=n_tests)
              for (p, k), c in corr.items()}
  n_steps = tail_len(br.k) if tail is None else tail
  nonfinite = [(s, b, o["n_nonfinite"], o["nonfinite"]) for (s, b), o in outs.items()
               if o["n_nonfinite"]]
  summary = (f"{len(pairs)} (checkpoint, policy) pairs joined over {len(br.from_steps)} "
             f"checkpoints, K = {br.k} steps (loss gap over the last {n_steps})")
  good = [key for key, c in corr.items() if related(c)]
  summary += (f": a relation (Holm-adjusted p < 0.05 over {n_tests} tests) for "
              + ", ".join(f"{p} vs {k}" for p, k in good) if good else
              f": no predictor x outcome pair shows evidence of a relation ({n_tests} tests, "
              "Holm-adjusted p < 0.05)")
  quiet = [k for k, c in counts.items() if c["n"] and c["above"] <= 0.5 * c["n"]]
  if quiet:
    summary += "; not distinguishable from the noise floor: " + ", ".join(quiet)
  return {"pairs": pairs, "floors": floors, "floor_counts": counts, "correlations": corr,
          "verdicts": verdicts, "predictors": names, "n_tests": n_tests,
          "skipped_rows": skipped, "unmatched": unmatched, "nonfinite": nonfinite, "k": br.k,
          "tail": n_steps, "summary": summary + "."}


def markdown(st: dict[str, Any], br: Branches, res: Results, figure: str | None = None
             ) -> list[str]:
  """The report section (markdown lines); ``figure``: the scatter PNG relative to report.md."""
  lines = [f"## {TITLE}", "",
           f"Branch study `{br.folder}` (training run `{br.meta.get('train_workdir', 'n/a')}`"
           f"): {st['summary'][0].upper()}{st['summary'][1:]}", ""]
  if br.meta.get("train_workdir") != res.meta.get("train_workdir"):
    lines += [f"Warning: the sweep's training run is `{res.meta.get('train_workdir', 'n/a')}`,"
              " not the branch study's.", ""]
  lines += ["Predictors: means over the finite evaluation batches of the sweep "
            f"(non-finite sweep rows skipped: {st['skipped_rows']}). Outcomes: after K steps "
            "from each checkpoint, against the BF16 branch on identical batches. Spearman "
            "correlations over the (checkpoint, policy) pairs with 95% percentile bootstrap "
            "CIs over the pairs and two-sided permutation p-values; a relation is stated when "
            f"the Holm-adjusted p-value over all {st['n_tests']} predictor x outcome pairs "
            "tested is below 0.05 (Holm: the chance of any false statement stays at 5% "
            "whatever the dependence between the predictors). 'within' averages the "
            "correlation across policies at each checkpoint (checkpoints with >= 3 policies), "
            "so a common trend over training does not dominate; the conditioning predictors "
            "are per checkpoint and have none.", ""]
  lines += [f"- {v}" for v in st["verdicts"].values()] + [""]
  rows = []
  for (p, k), c in st["correlations"].items():
    ci = f"[{fmt(c['lo'])}, {fmt(c['hi'])}]" if not c["reason"] else c["reason"]
    rows.append([p, k, c["n"], c["n_excluded"], fmt(c["rho"]), ci, fmt_p(c["p"]),
                 fmt_p(c["p_adj"]), f"{fmt(c['within'])} ({c['n_groups']})"])
  lines += table(["predictor", "outcome", "n", "excluded", "Spearman rho", "95% CI", "p",
                   "Holm p", "within (checkpoints)"], rows)
  lines += ["Noise floor per checkpoint (the most divergent noise branch) and the policy "
            "branches above it:", ""]
  above = defaultdict(lambda: [0, 0])
  for x in st["pairs"]:
    for k in ("param_div", "loss_gap"):
      if x["above"][k] is not None:
        above[(x["step"], k)][0] += x["above"][k]
        above[(x["step"], k)][1] += 1
  rows = [[s, f["n_noise"], fmt(f["param_div"]), "{} of {}".format(*above[(s, "param_div")]),
           fmt(f["loss_gap"]), "{} of {}".format(*above[(s, "loss_gap")]),
           fmt(f["routing_div"]), fmt(1 - f["update_cos"])] for s, f in st["floors"].items()]
  lines += table(["from step", "noise branches", "param_div floor", "above",
                   "abs loss gap floor", "above", "routing_div floor",
                   "1 - update_cos floor"],
                  rows)
  if st["nonfinite"]:
    lines += ["Branches with non-finite steps (those steps left out):", ""]
    lines += table(["from step", "branch", "non-finite steps", "first"],
                    [list(x) for x in st["nonfinite"]])
  if st["unmatched"]:
    lines += ["Policy branches without sweep rows (not joined): " + ", ".join(
        f"{b}@{s}" for s, b in st["unmatched"]), ""]
  if figure:
    lines += [f"![trajectory]({figure})", ""]
  return lines
