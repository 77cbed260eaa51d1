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
divergence). :func:`study` joins both on (step == from_step, policy), and gives each
predictor x outcome pair a Spearman correlation with a percentile bootstrap 95% CI over the
pairs (fixed seed), the mean within-checkpoint Spearman correlation, and a verdict sentence.
:func:`markdown` renders the report section.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
import dataclasses
import json
import math
import pathlib
import re
from typing import Any

import numpy as np

from fp8jax.metrics.ranking import spearman
from fp8jax.study import results
from fp8jax.study.results import Results
from fp8jax.study.stats import fmt

TITLE = "Does the one-step perturbation predict the trajectory?"
KINDS = ("reference", "noise", "policy")
OUTCOMES = {"param_div": "K-step parameter divergence", "loss_gap": "K-step relative loss gap",
            "update_cos": "mean update cosine", "routing_div": "routing divergence at K",
            "growth_rate": "divergence growth rate (per step)"}
"""Outcome name -> description (all dimensionless; growth_rate in 1/step)."""
FLOOR_SIGN = {"param_div": 1, "loss_gap": 1, "routing_div": 1, "update_cos": -1}
"""Outcomes with a noise floor: +1 larger is further from BF16 (loss_gap by |value|), -1
smaller is."""
PREDICTORS = {"rel_err": "one-step relative gradient error",
              "share_direct": "direct share of the perturbation",
              "routing": "one-step routing divergence"}
"""Predictor name -> description (dimensionless)."""
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
  meta = json.loads((folder / "meta.json").read_text())
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
  """``({(step, policy): {predictor: mean over the finite rows}}, rows skipped as
  non-finite)``; routing is each row's mean over the MoE layers (NaN without routing)."""
  out, skipped = {}, 0
  for p in res.policies:
    for s in res.steps:
      acc = defaultdict(list)
      for r in res.rows_of(p, [s]):
        if not r["finite"]:
          skipped += 1
          continue
        layers = [float(v) for k, v in r.items() if _ROUTING.match(k) and v is not None]
        vals = {"rel_err": r.get("rel_err"), "share_direct": r.get("share_direct"),
                "routing": float(np.mean(layers)) if layers else None}
        for k, v in vals.items():
          if v is not None and math.isfinite(float(v)):
            acc[k].append(float(v))
      out[(s, p)] = {k: float(np.mean(acc[k])) if acc[k] else math.nan for k in PREDICTORS}
  return out, skipped


def correlate(x: Sequence[float], y: Sequence[float], groups: Sequence[Any] | None = None,
              n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
  """Spearman correlation of the pairs with finite x and y: ``rho``, percentile bootstrap
  95% CI ``lo``/``hi`` (``n_boot`` resamples of the pairs, ``seed``), ``n``, ``n_excluded``,
  ``within`` (the mean over ``groups`` of their Spearman correlation, groups of >= 3
  non-constant pairs) and ``n_groups``; ``reason`` (rho NaN) when there is not enough data.
  """
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  g = np.zeros(x.size, int) if groups is None else np.asarray(groups)
  ok = np.isfinite(x) & np.isfinite(y)
  x, y, g = x[ok], y[ok], g[ok]
  out = {"rho": math.nan, "lo": math.nan, "hi": math.nan, "n": int(x.size),
         "n_excluded": int((~ok).sum()), "within": math.nan, "n_groups": 0, "reason": None}
  if x.size < 3:
    out["reason"] = f"{x.size} pairs, fewer than 3"
    return out
  if np.ptp(x) == 0 or np.ptp(y) == 0:
    out["reason"] = "constant " + ("predictor" if np.ptp(x) == 0 else "outcome")
    return out
  out["rho"] = spearman(x, y)
  idx = np.random.default_rng(seed).integers(0, x.size, size=(n_boot, x.size))
  boot = np.array([spearman(x[i], y[i]) for i in idx])
  boot = boot[np.isfinite(boot)]
  if boot.size:
    out["lo"], out["hi"] = (float(v) for v in np.percentile(boot, [2.5, 97.5]))
  within = [spearman(x[g == k], y[g == k]) for k in dict.fromkeys(g.tolist())
            if (g == k).sum() >= 3]
  within = [w for w in within if math.isfinite(w)]
  if within:
    out["within"], out["n_groups"] = float(np.mean(within)), len(within)
  return out


def floor_summary(pairs: list[dict], name: str) -> dict[str, int]:
  """``{"above", "n"}``: how many policy branches (with a defined floor) exceed it."""
  flags = [p["above"][name] for p in pairs if p["above"].get(name) is not None]
  return {"above": int(sum(flags)), "n": len(flags)}


def verdict(pred: str, name: str, c: dict, floor: dict | None, min_above: float = 0.5
            ) -> str:
  """A sentence with the numbers of one predictor x outcome correlation; outcomes above
  their noise floor in at most a ``min_above`` fraction of branches are called "not
  distinguishable from the noise floor"."""
  head = f"{pred} vs {name}: "
  if c["reason"]:
    return head + f"not enough data ({c['reason']}; n = {c['n']})."
  excl = f", {c['n_excluded']} excluded as non-finite or undefined" if c["n_excluded"] else ""
  text = (head + f"Spearman rho = {fmt(c['rho'])} (95% CI [{fmt(c['lo'])}, {fmt(c['hi'])}], "
          f"n = {c['n']}{excl})")
  if c["n_groups"]:
    text += (f"; within checkpoints mean rho = {fmt(c['within'])} over {c['n_groups']} "
             "checkpoints")
  if not math.isfinite(c["lo"]):
    text += ". Undetermined (no bootstrap interval)."
  elif c["lo"] <= 0 <= c["hi"]:
    text += ". No evidence of a relation (the CI contains 0)."
  else:
    text += f". A {'positive' if c['rho'] > 0 else 'negative'} relation (the CI excludes 0)."
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
  ``above``), ``floors``, ``floor_counts`` per outcome, ``correlations`` {(predictor,
  outcome): correlate(...)}, ``verdicts`` (same keys), ``skipped_rows``, ``unmatched``
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
  corr, verdicts = {}, {}
  for p in PREDICTORS:
    for k in OUTCOMES:
      c = correlate([x[p] for x in pairs], [x["outcome"][k] for x in pairs],
                    [x["step"] for x in pairs], n_boot, seed)
      corr[(p, k)], verdicts[(p, k)] = c, verdict(p, k, c, counts.get(k))
  n_steps = tail_len(br.k) if tail is None else tail
  nonfinite = [(s, b, o["n_nonfinite"], o["nonfinite"]) for (s, b), o in outs.items()
               if o["n_nonfinite"]]
  summary = (f"{len(pairs)} (checkpoint, policy) pairs joined over {len(br.from_steps)} "
             f"checkpoints, K = {br.k} steps (loss gap over the last {n_steps})")
  good = [key for key, c in corr.items() if math.isfinite(c["lo"]) and not c["lo"] <= 0
          <= c["hi"]]
  summary += (": a relation (CI excluding 0) for " + ", ".join(f"{p} vs {k}" for p, k in good)
              if good else ": no predictor x outcome pair shows evidence of a relation")
  quiet = [k for k, c in counts.items() if c["n"] and c["above"] <= 0.5 * c["n"]]
  if quiet:
    summary += "; not distinguishable from the noise floor: " + ", ".join(quiet)
  return {"pairs": pairs, "floors": floors, "floor_counts": counts, "correlations": corr,
          "verdicts": verdicts, "skipped_rows": skipped, "unmatched": unmatched,
          "nonfinite": nonfinite, "k": br.k, "tail": n_steps, "summary": summary + "."}


def _table(header: Sequence[str], rows: list[Sequence[Any]]) -> list[str]:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]


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
            "CIs over the pairs; 'within' averages the correlation across policies at each "
            "checkpoint (checkpoints with >= 3 policies), so a common trend over training does "
            "not dominate.", ""]
  lines += [f"- {v}" for v in st["verdicts"].values()] + [""]
  rows = []
  for (p, k), c in st["correlations"].items():
    ci = f"[{fmt(c['lo'])}, {fmt(c['hi'])}]" if not c["reason"] else c["reason"]
    rows.append([p, k, c["n"], c["n_excluded"], fmt(c["rho"]), ci,
                 f"{fmt(c['within'])} ({c['n_groups']})"])
  lines += _table(["predictor", "outcome", "n", "excluded", "Spearman rho", "95% CI",
                   "within (checkpoints)"], rows)
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
  lines += _table(["from step", "noise branches", "param_div floor", "above",
                   "abs loss gap floor", "above", "routing_div floor",
                   "1 - update_cos floor"],
                  rows)
  if st["nonfinite"]:
    lines += ["Branches with non-finite steps (those steps left out):", ""]
    lines += _table(["from step", "branch", "non-finite steps", "first"],
                    [list(x) for x in st["nonfinite"]])
  if st["unmatched"]:
    lines += ["Policy branches without sweep rows (not joined): " + ", ".join(
        f"{b}@{s}" for s, b in st["unmatched"]), ""]
  if figure:
    lines += [f"![trajectory]({figure})", ""]
  return lines
