"""The questions of the precision study, answered from a loaded sweep.

(1) module: attention vs MoE (a dense grid's MLP) at the same depth and format; (2) depth:
the fewest vs the most quantized layers per module and format; (3) format: E4M3 vs E5M2
per module and depth; (4) redistribution: how the top-k parameters by gradient difference
norm move across checkpoints, and the share of the difference inside the directly
quantized modules; (5) narrowing: how the perturbation grows from 8-bit to 4-bit GEMM
recipes, per module (:mod:`fp8jax.study.comparison.format_width`).

Comparisons are paired on the same batches (:func:`fp8jax.study.common.stats.compare`): the ratio
a / b per batch, its geometric mean per checkpoint and the median over the checkpoints with
a bootstrap 95% interval. Each answer is a dict (numbers, Stats and Summaries, and a
``summary`` sentence derived from them); when a checkpoint is flagged for its conditioning
(:func:`fp8jax.study.comparison.conditioning.flags`), the summaries of (1)-(4) say whether it drives
the result. :func:`markdown` renders them. A grid that lacks the policies of a question
gives ``available: False`` and says what is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

import numpy as np

from fp8jax.metrics import paths, ranking
from fp8jax.study.common.results import Results, depth_layers
from fp8jax.study.common.stats import compare, fmt, fmt_stat, mean_details, stat, table, trajectory
from fp8jax.study.comparison import conditioning, format_width

_MOD = {"attn": "attention", "moe": "MoE", "mlp": "MLP"}
_FMT = {"e4m3": "E4M3", "e5m2": "E5M2"}


def depth_label(depth: str) -> str:
  """``"l0"`` -> ``"layer 0"``, ``"l0-8"`` -> ``"layers 0-8"``."""
  return ("layers " if "-" in depth else "layer ") + depth[1:]


def site_cells(res: Results) -> dict[tuple[str, str, str], str]:
  """``{(module, depth, fmt): policy name}`` of the site-grid cells present (from the
  policies' records, :meth:`Results.cell`; the first name of a cell computed twice)."""
  out = {}
  for n in res.policies:
    if (c := res.cell(n)) is not None:
      out.setdefault(c, n)
  return out


def _lower_sentence(a: str, b: str, comps: list[dict], what: str, unit: str) -> str:
  """Which of a, b is lower (the paired ratio a / b below or above 1, or for a signed
  metric the paired difference below or above 0) in how many comparisons, with the ratios
  and how many paired intervals exclude the null."""
  side = [c["ratio"] - 1 if c["log"] else c["paired"].center for c in comps]
  n_a = sum(d < 0 for d in side)
  n_b = sum(d > 0 for d in side)
  n = len(comps)
  if n_a > n_b:
    text = f"{a} has lower {what} than {b} in {n_a} of {n} {unit}"
  elif n_b > n_a:
    text = f"{b} has lower {what} than {a} in {n_b} of {n} {unit}"
  else:
    text = f"neither is consistently lower: {a} has lower {what} than {b} in {n_a} of {n} {unit}"
  ratios = [c["ratio"] for c in comps if math.isfinite(c["ratio"])]
  if ratios:
    span = fmt(min(ratios)) if len(ratios) == 1 else f"{fmt(min(ratios))} to {fmt(max(ratios))}"
    kind = "paired ratio, median over checkpoints" if comps[0]["log"] else "ratio of medians"
    text += (f" ({a} / {b} {kind}: {span}; the 95% interval excludes "
             f"{'1' if comps[0]['log'] else '0'} in {sum(c['excludes_null'] for c in comps)} "
             f"of {n})")
  return text


def _with_flags(text: str, res: Results, comps: list[tuple[str, dict]],
                flagged: Sequence[int]) -> str:
  note = conditioning.flag_note(res, comps, flagged)
  return f"{text}. {note[:-1]}" if note else text


def _pairs(res: Results, axis: int, a_val: str, b_val: str) -> list[tuple[tuple, str, str]]:
  """Seed-grid pairs that differ only in coordinate ``axis`` (a_val vs b_val)."""
  grid = site_cells(res)
  out = []
  for key, name in grid.items():
    if key[axis] == a_val:
      other = key[:axis] + (b_val,) + key[axis + 1:]
      if other in grid:
        out.append((tuple(k for i, k in enumerate(key) if i != axis), name, grid[other]))
  return sorted(out)


def _unavailable(need: str) -> dict[str, Any]:
  return {"available": False, "settings": [],
          "summary": f"Not available: the grid lacks {need}."}


def other_module(res: Results) -> str:
  """The grid's module beside attention: "moe", or "mlp" in a dense model's grid."""
  modules = {c[0] for c in site_cells(res)}
  return "mlp" if "mlp" in modules and "moe" not in modules else "moe"


def module_answer(res: Results, metric: str = "rel_err", flagged: Sequence[int] = ()
                  ) -> dict[str, Any]:
  """(1) Attention vs :func:`other_module` at the same depth and format: the paired ratio,
  each policy's trajectory shape (``settings`` keyed by module: "attn", "moe" or "mlp");
  ``flagged``: checkpoints flagged for conditioning."""
  other = other_module(res)
  pairs = _pairs(res, 0, "attn", other)
  if not pairs:
    return _unavailable(f"an attention and a{'n' if other == 'mlp' else ''} {_MOD[other]} policy "
                        "of the same depth and format")
  settings = [{"depth": depth, "format": fm, "attn": attn, other: pol,
               "comparison": compare(res, attn, pol, metric),
               "trajectory_attn": trajectory(res, attn, metric),
               f"trajectory_{other}": trajectory(res, pol, metric)}
              for (depth, fm), attn, pol in pairs]
  text = _lower_sentence("attention", _MOD[other], [x["comparison"] for x in settings],
                         metric, "settings (depth, format)")
  text = _with_flags(text, res, [(f"{depth_label(x['depth'])} {_FMT[x['format']]}",
                                  x["comparison"]) for x in settings], flagged)
  text += ". Trajectory shapes (late vs early "
  parts = []
  for mod in ("attn", other):
    found = [x[f"trajectory_{mod}"]["shape"] for x in settings]
    counts = {s: found.count(s) for s in dict.fromkeys(found) if s}
    desc = ", ".join(f"{s} in {k} of {len(found)}" for s, k in counts.items()) or "undetermined"
    parts.append(f"{_MOD[mod]}: {desc}")
  text += "checkpoints): " + "; ".join(parts) + "."
  return {"available": True, "metric": metric, "module": other, "settings": settings,
          "summary": text}


CLOSE_TOL = 0.25
"""Depth settings whose mean ratio is within [1/(1+tol), 1+tol] count as close."""


def depth_verdict(c: dict, tol: float = CLOSE_TOL) -> str:
  """"different", "close but not equal" (the paired interval excludes the null over the
  checkpoints or at some checkpoint), "close, not distinguishable" or "undetermined" for a
  comparison."""
  r = c["ratio"]
  if not math.isfinite(r) or r <= 0:
    return "undetermined"
  if abs(math.log(r)) > math.log1p(tol):
    return "different"
  if c["excludes_null"] or c["steps_excludes_null"]:
    return "close but not equal"
  return "close, not distinguishable"


def depth_answer(res: Results, metric: str = "rel_err", tol: float = CLOSE_TOL,
                 flagged: Sequence[int] = ()) -> dict[str, Any]:
  """(2) The fewest vs the most quantized layers, per module and format: the paired ratio
  deep/shallow, CI overlap per checkpoint, and the verdict."""
  grid = site_cells(res)
  settings = []
  for mod, fm in sorted({(k[0], k[2]) for k in grid}):
    depths = sorted({k[1] for k in grid if k[0] == mod and k[2] == fm}, key=depth_layers)
    if len(depths) < 2 or depth_layers(depths[0]) == depth_layers(depths[-1]):
      continue
    shallow, deep = depths[0], depths[-1]
    c = compare(res, grid[(mod, deep, fm)], grid[(mod, shallow, fm)], metric)
    settings.append({"module": mod, "format": fm, "deep": deep, "shallow": shallow,
                     "comparison": c, "verdict": depth_verdict(c, tol)})
  if not settings:
    return _unavailable("two depths of one module and format")
  parts = []
  for mod in dict.fromkeys(s["module"] for s in settings):
    mine = [s for s in settings if s["module"] == mod]
    verdicts = [s["verdict"] for s in mine]
    counts = ", ".join(f"{v} in {verdicts.count(v)} of {len(mine)}"
                       for v in dict.fromkeys(verdicts))
    ratios = ", ".join(f"{fmt(s['comparison']['ratio'])} ({_FMT[s['format']]})" for s in mine)
    parts.append(f"{_MOD[mod]}: {depth_label(mine[0]['deep'])} vs "
                 f"{depth_label(mine[0]['shallow'])} paired {metric} ratio {ratios}: {counts}")
  text = "; ".join(parts) + f" (close: ratio within a factor {1 + tol:g})"
  text = _with_flags(text, res, [(f"{_MOD[x['module']]} {_FMT[x['format']]}", x["comparison"])
                                 for x in settings], flagged)
  return {"available": True, "metric": metric, "tol": tol, "settings": settings,
          "summary": text + "."}


def format_answer(res: Results, metrics: Sequence[str] = ("rel_err", "loss_rel_err"),
                  flagged: Sequence[int] = ()) -> dict[str, Any]:
  """(3) E4M3 vs E5M2 per module and depth, on each of ``metrics`` (paired ratios)."""
  pairs = _pairs(res, 2, "e4m3", "e5m2")
  if not pairs:
    return _unavailable("an E4M3 and an E5M2 policy of the same module and depth")
  settings = [{"module": mod, "depth": depth, "e4m3": a, "e5m2": b,
               "comparisons": {m: compare(res, a, b, m) for m in metrics}}
              for (mod, depth), a, b in pairs]
  sentences = []
  for m in metrics:
    sentences.append(_lower_sentence("E4M3", "E5M2", [s["comparisons"][m] for s in settings],
                                     m, "settings (module, depth)"))
  text = _with_flags("; ".join(sentences), res,
                     [(f"{_MOD[s['module']]} {depth_label(s['depth'])} {m}", s["comparisons"][m])
                      for s in settings for m in metrics], flagged)
  return {"available": True, "metrics": list(metrics), "settings": settings,
          "summary": text + "."}


def _nanmean(values) -> float:
  v = [x for x in values if x is not None and math.isfinite(x)]
  return float(np.mean(v)) if v else math.nan


def redistribution(res: Results, policy: str, k: int = 10,
                   classifier: paths.Classifier | None = None) -> dict[str, Any]:
  """(4) Migration of the top-``k`` parameters by diff_norm (details averaged over the
  batches) across checkpoints, with the share of the squared difference in the directly
  quantized modules (``share_direct``) per checkpoint. ``classifier``: the modules of the
  parameter paths (default: the sweep's, :attr:`Results.classifier`)."""
  series = [(s, v) for s in res.steps if (v := mean_details(res, policy, s))]
  if len(series) < 2:
    return {"available": False, "policy": policy,
            "summary": "Not available: fewer than 2 checkpoints with per-parameter details."}
  rows = ranking.migration(series, k, res.direct(policy) or None,
                           classifier=classifier or res.classifier)
  for row in rows:
    row["share_direct"] = stat(res, "share_direct", policy, [row["checkpoint"]])
  first, last = rows[0], rows[-1]
  return {"available": True, "policy": policy, "k": k, "migration": rows,
          "overlap_first_last": last["overlap_first"],
          "spearman_first_last": last["spearman_first"],
          "direct_topk_first": first.get("direct_share"),
          "direct_topk_last": last.get("direct_share"),
          "share_direct_first": first["share_direct"].mean,
          "share_direct_last": last["share_direct"].mean}


def redistribution_answer(res: Results, k: int = 10, flagged: Sequence[int] = ()
                          ) -> dict[str, Any]:
  """(4) :func:`redistribution` of every policy, with a summary across policies; names the
  first or last checkpoint when it is flagged (the comparison is first vs last). With a
  noise floor that has details, its own migration is the yardstick (``floor``): when its
  top-k overlap first vs last is no higher than the policies' mean, the migration is the
  checkpoints', not the policies'."""
  per = {p: redistribution(res, p, k) for p in res.policies}
  ok = [r for r in per.values() if r["available"]]
  if not ok:
    return {**_unavailable("2 checkpoints with per-parameter details"), "policies": per}
  moved = sum(r["overlap_first_last"] < 1 for r in ok)
  text = (f"The top-{k} parameters by diff_norm at the last checkpoint differ from those at "
          f"the first in {moved} of {len(ok)} policies (mean top-{k} overlap "
          f"{fmt(np.mean([r['overlap_first_last'] for r in ok]))}, mean Spearman "
          f"{fmt(_nanmean([r['spearman_first_last'] for r in ok]))} first vs last)")
  direct = [r for r in ok if r["direct_topk_first"] is not None]
  if direct:
    lower = sum(r["direct_topk_last"] < r["direct_topk_first"] for r in direct)
    higher = sum(r["direct_topk_last"] > r["direct_topk_first"] for r in direct)
    text += (f". The fraction of the top-{k} in directly quantized modules goes from "
             f"{fmt(np.mean([r['direct_topk_first'] for r in direct]))} to "
             f"{fmt(np.mean([r['direct_topk_last'] for r in direct]))} (mean over policies): "
             f"lower at the last checkpoint than at the first in {lower} of {len(direct)} "
             f"policies, higher in {higher}")
  sd = [r for r in ok if math.isfinite(r["share_direct_first"])
        and math.isfinite(r["share_direct_last"])]
  if sd:
    down = sum(r["share_direct_last"] < r["share_direct_first"] for r in sd)
    text += (". share_direct (the direct modules' share of the squared gradient difference) "
             f"decreases from the first to the last checkpoint in {down} of {len(sd)} policies")
  floor = redistribution(res, res.floor, k) if res.floor else {"available": False}
  if floor["available"]:
    alike = floor["overlap_first_last"] <= np.mean([r["overlap_first_last"] for r in ok])
    text += (f". The noise floor's own top-{k} ({res.reference} at perturbed weights) moves "
             f"{'as much' if alike else 'less'}: overlap "
             f"{fmt(floor['overlap_first_last'])}, Spearman "
             f"{fmt(floor['spearman_first_last'])} first vs last"
             + (", so the migration is the checkpoints' own, not the policies'" if alike
                else ""))
  ends = sorted({r["migration"][i]["checkpoint"] for r in ok for i in (0, -1)}
                & set(flagged))
  if ends:
    text += (f". The first-vs-last comparison rests on flagged checkpoint"
             f"{'s' if len(ends) > 1 else ''} {', '.join(map(str, ends))} (conditioning)")
  return {"available": True, "k": k, "policies": per, "floor": floor, "summary": text + "."}


def answers(res: Results, top_k: int = 10, flagged: Sequence[int] | None = None
            ) -> dict[str, dict]:
  """The answers as data: ``module``, ``depth``, ``format``, ``redistribution``,
  ``narrowing``; ``flagged`` checkpoints (default: :func:`conditioning.flags`)."""
  flagged = list(conditioning.flags(res)) if flagged is None else list(flagged)
  return {"module": module_answer(res, flagged=flagged),
          "depth": depth_answer(res, flagged=flagged),
          "format": format_answer(res, flagged=flagged),
          "redistribution": redistribution_answer(res, top_k, flagged),
          "narrowing": format_width.narrowing_answer(res)}




# --- markdown ----------------------------------------------------------------------------

def _cap(text: str) -> str:
  return text[:1].upper() + text[1:]


def _steps_text(c: dict) -> tuple[str, str]:
  m = len(c["per_step"])
  return f"{c['steps_overlap']} of {m}", f"{c['steps_excludes_null']} of {m}"


def _shape(t: dict) -> str:
  if t["shape"] is None:
    return "n/a"
  return f"{t['shape']} ({fmt(t['early'].mean)} -> {fmt(t['late'].mean)}, x{fmt(t['ratio'])})"


def _module_md(a: dict) -> list[str]:
  other = a.get("module", "moe")
  label = _MOD[other]
  rows = []
  for s in a["settings"]:
    c = s["comparison"]
    rows.append([depth_label(s["depth"]), _FMT[s["format"]], fmt_stat(c["summary_a"]),
                 fmt_stat(c["summary_b"]), fmt_stat(c["paired"], n=False), _steps_text(c)[0],
                 _shape(s["trajectory_attn"]), _shape(s[f"trajectory_{other}"])])
  return table(["depth", "format", f"attention {a['metric']}", f"{label} {a['metric']}",
                f"attention / {label} (paired)", "checkpoints with overlapping CIs",
                "attention shape (early -> late)", f"{label} shape (early -> late)"], rows)


def _depth_md(a: dict) -> list[str]:
  rows = []
  for s in a["settings"]:
    c = s["comparison"]
    overlap, nonzero = _steps_text(c)
    rows.append([_MOD[s["module"]], _FMT[s["format"]], fmt_stat(c["summary_a"]),
                 fmt_stat(c["summary_b"]), fmt_stat(c["paired"], n=False), overlap,
                 nonzero, s["verdict"]])
  deep, shallow = a["settings"][0]["deep"], a["settings"][0]["shallow"]
  return table(["module", "format", depth_label(deep), depth_label(shallow),
                     "paired ratio", "checkpoints with overlapping CIs",
                     "checkpoints where the paired CI excludes 1", "verdict"], rows)


def _format_md(a: dict) -> list[str]:
  rows = []
  for s in a["settings"]:
    for m, c in s["comparisons"].items():
      overlap, nonzero = _steps_text(c)
      rows.append([_MOD[s["module"]], depth_label(s["depth"]), m, fmt_stat(c["summary_a"]),
                   fmt_stat(c["summary_b"]), fmt_stat(c["paired"], n=False), overlap,
                   nonzero])
  return table(["module", "depth", "metric", "E4M3", "E5M2", "E4M3 / E5M2 (paired)",
                     "checkpoints with overlapping CIs",
                     "checkpoints where the paired CI excludes 1"], rows)


def _redistribution_md(a: dict) -> list[str]:
  lines = []
  for p, r in a.get("policies", {}).items():
    lines += [f"### {p}", ""]
    if not r["available"]:
      lines += [r["summary"], ""]
      continue
    rows = [[m["checkpoint"], fmt(m["overlap_prev"]), fmt(m["overlap_first"]),
             fmt(m["spearman_prev"]), fmt(m["spearman_first"]), fmt(m.get("direct_share")),
             fmt_stat(m["share_direct"], n=False),
             ", ".join(f"{k} {v}" for k, v in m["topk_modules"].items())]
            for m in r["migration"]]
    k = r["k"]
    lines += table(["step", f"top-{k} overlap prev", "overlap first", "Spearman prev",
                    "Spearman first", f"top-{k} in direct", "share_direct", f"top-{k} modules"],
                   rows)
    first, last = r["migration"][0], r["migration"][-1]
    lines += [f"Top-{k} at step {first['checkpoint']}: " + ", ".join(
        f"`{x}`" for x in first["top"]), "",
              f"Top-{k} at step {last['checkpoint']}: " + ", ".join(
                  f"`{x}`" for x in last["top"]), ""]
  return lines


def markdown(ans: dict[str, dict], figures: dict[str, Any] | None = None) -> list[str]:
  """The answers as markdown lines (figure links for names in ``figures``)."""
  figures = figures or {}
  other = _MOD[ans.get("module", {}).get("module", "moe")]
  sections = [("module", f"1. Module sensitivity: attention vs {other}", _module_md,
               ("grad_error", "loss_curves")),
              ("depth", "2. Depth sensitivity", _depth_md, ("grad_error", "heatmaps")),
              ("format", "3. Format sensitivity: E4M3 vs E5M2", _format_md,
               ("grad_error", "loss_vs_grad")),
              ("redistribution", "4. Perturbation redistribution", _redistribution_md,
               ("migration", "heatmaps", "routing")),
              ("narrowing", "5. Format width: from FP8 to FP4 recipes", format_width.markdown,
               ("format_width",))]
  lines = []
  for key, title, render, figs in sections:
    if key not in ans:
      continue
    a = ans[key]
    lines += [f"## {title}", "", _cap(a["summary"]), ""]
    if a["available"]:
      lines += render(a)
    lines += [f"![{f}]({figures[f]})" for f in figs if f in figures] + [""]
  return lines
