"""The validation matrix: full training runs of several recipes x seeds, resumable across
sessions, and their gaps to BF16 against BF16's own seed-to-seed spread.

    m = Matrix(recipes=("bf16", "gemm:fp32_blockwise", "gemm:nvfp4_recipe"), seeds=(0, 1, 2))
    run_matrix(base_cfg, "out/validation", m, deadline=time.monotonic() + 540)
    table = summarize("out/validation", m)          # also summary.json and summary.md

The runs (:class:`Matrix`, :func:`run_matrix`, re-exported here) are
:mod:`fp8jax.study.runs.matrix`.

The summary: per run the mean ``metric`` over the last ``tail`` share of its logged steps
(the overlay's tail mean; nats per token), as the runs evaluated it
(``train.eval_precision``, :mod:`fp8jax.train.evaluation`: the training forward's loss, or
the evaluation forward's in the run's policy or in BF16, ``eval/<metric>``; the summary
says which, and refuses runs evaluated differently); per recipe the relative gap to BF16 of the same
seed, ``(loss - loss_bf16) / loss_bf16``, with its mean and 95% t-interval over seeds, next
to BF16's own seed-to-seed spread (the relative standard deviation of the BF16 tail means):
the yardstick a gap must exceed to mean anything. A verdict against a bound (e.g. DeepSeek-V3's
0.25%) is "within" only when the whole interval lies inside it, "outside" when it lies
outside, and "cannot tell" otherwise. Non-finite runs are listed, never averaged.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import math
import pathlib
from typing import Any

import numpy as np

from fp8jax.study.common import results_io
from fp8jax.study.common.intervals import Stat, mean_ci
from fp8jax.study.runs import one_step_ranking
from fp8jax.study.runs.matrix import (  # noqa: F401  (re-exported: the matrix's API)
    DONE,
    REFERENCE,
    Matrix,
    parse_seeds,
    run_matrix,
    run_name,
)
from fp8jax.study.runs.overlay import load_run, tail_count
from fp8jax.train import determinism, evaluation, noise_probe


def tail_value(workdir, metric: str = "lm_loss", tail: float = 0.1) -> float:
  """The mean of ``metric`` (a metrics column) over the last ``tail`` share of a run's
  logged steps (NaN when a value there is not finite or absent)."""
  run = load_run(workdir)
  values = run.series(metric)
  values = values[-tail_count(len(values), tail):]
  return float(values.mean()) if np.all(np.isfinite(values)) else math.nan


def _probe_summary(rows) -> dict[str, Any]:
  """A run's gradient-to-noise ratios (``train.noise_probe_every``): the first and last,
  and the first step below sqrt(3) (arXiv 2505.19115) with the LM loss's drop after it."""
  probed = [r for r in rows if "probe/ratio" in r]
  step = noise_probe.crossing(probed)
  lm = {r["step"]: r.get("lm_loss", math.nan) for r in rows}
  after = (lm[step] - lm[max(lm)]) if step is not None else math.nan
  return {"first": probed[0]["probe/ratio"], "last": probed[-1]["probe/ratio"],
          "cross_step": step, "lm_drop_after": after}


def verdict(gap: Stat, bound: float) -> str:
  """"within" the relative ``bound`` (the whole interval in [-bound, bound]), "outside" (the
  interval clear of it) or "cannot tell"."""
  if not gap.has_ci:
    return "cannot tell"
  if -bound <= gap.lo and gap.hi <= bound:
    return "within"
  if gap.lo > bound or gap.hi < -bound:
    return "outside"
  return "cannot tell"


def parse_contrast(text: str, matrix: Matrix | None = None) -> tuple[str, str]:
  """``"gemm:mxfp4 vs gemm:nvfp4"`` -> ("gemm:mxfp4", "gemm:nvfp4"), both recipes of
  ``matrix`` when given (checked before any run)."""
  parts = [p.strip() for p in str(text).split(" vs ")]
  if len(parts) != 2 or not all(parts):
    raise ValueError(f"contrast {text!r}: expected 'RECIPE_A vs RECIPE_B'")
  for r in parts:
    if matrix is not None and r not in matrix.recipes:
      raise ValueError(f"contrast {text!r}: {r!r} is not among the recipes "
                       f"{list(matrix.recipes)}")
  return parts[0], parts[1]


def contrast(recipes: dict[str, Any], a: str, b: str) -> dict[str, Any]:
  """``gap(a) - gap(b)`` per seed (both finished and finite), mean and t-interval: does
  recipe ``a`` lose more than ``b``? Paired by seed, so the shared BF16 run cancels."""
  for r in (a, b):
    if r not in recipes:
      raise ValueError(f"contrast {a!r} vs {b!r}: {r!r} is not a recipe of the matrix "
                       f"({', '.join(recipes)})")
  ga, gb = (dict(zip(recipes[r]["gap_seeds"], recipes[r]["gaps"])) for r in (a, b))
  diffs = [ga[s] - gb[s] for s in ga if s in gb]
  stat = mean_ci(diffs)
  sign = ("a > b" if stat.has_ci and stat.lo > 0 else "a < b" if stat.has_ci and stat.hi < 0
          else "cannot tell")
  return {"a": a, "b": b, "diffs": diffs, "diff": dataclasses.asdict(stat), "verdict": sign}


def summarize(out, matrix: Matrix, metric: str = "lm_loss", tail: float = 0.1,
              bound: float = 0.0025, contrasts: Sequence[tuple[str, str]] = (),
              one_step: str | pathlib.Path | None = None) -> dict[str, Any]:
  """Tail values per run, gaps to BF16 per recipe over seeds, the BF16 spread, and the
  ``contrasts`` (recipe pairs, :func:`contrast`); with ``one_step`` (a folder of one-step
  comparisons on the BF16 runs' checkpoints), the rank agreement of that comparison with
  the gaps (:mod:`fp8jax.study.runs.one_step_ranking`). Writes ``<out>/summary.json`` and
  ``<out>/summary.md``. Unfinished runs are left out and listed."""
  out = pathlib.Path(out)
  value, missing, nonfinite, modes, probes, evaluated = {}, [], [], {}, {}, {}
  for recipe, seed in matrix.runs():
    workdir = out / "runs" / run_name(recipe, seed)
    if not (workdir / DONE).exists():
      missing.append(run_name(recipe, seed))
      continue
    run = load_run(workdir)
    mode = determinism.mode_of(run.config)
    modes[mode] = modes.get(mode, 0) + 1
    if any("probe/ratio" in r for r in run.rows):
      probes.setdefault(recipe, {})[seed] = _probe_summary(run.rows)
    key = (evaluation.precision_of(run.config), evaluation.column(metric, run.config))
    evaluated.setdefault(key, []).append(run_name(recipe, seed))
    value[(recipe, seed)] = v = tail_value(workdir, key[1], tail)
    if math.isnan(v):
      nonfinite.append(run_name(recipe, seed))
  if len(evaluated) > 1:
    raise ValueError("the runs were evaluated differently (train.eval_precision), so their "
                     "gaps do not compare: " + "; ".join(
                         f"{p} ({c}): {', '.join(names)}" for (p, c), names in evaluated.items()))
  precision, column = next(iter(evaluated), (None, None))
  ref = {s: value.get((REFERENCE, s), math.nan) for s in matrix.seeds}
  ref_ok = [v for v in ref.values() if math.isfinite(v)]
  spread = (float(np.std(ref_ok, ddof=1) / np.mean(ref_ok)) if len(ref_ok) >= 2 else math.nan)
  recipes = {}
  for recipe in matrix.recipes:
    finals = {s: value[(recipe, s)] for s in matrix.seeds if (recipe, s) in value}
    seeds = [s for s in finals if math.isfinite(finals[s]) and math.isfinite(ref[s])]
    gaps = [(finals[s] - ref[s]) / ref[s] for s in seeds]
    gap = mean_ci(gaps)
    recipes[recipe] = {"tail": finals, "gaps": gaps, "gap_seeds": seeds,
                       "gap": dataclasses.asdict(gap),
                       "verdict": "reference" if recipe == REFERENCE else verdict(gap, bound),
                       "gap_over_spread": (abs(gap.mean) / spread
                                           if spread and math.isfinite(spread) else math.nan)}
  summary = {"metric": metric, "eval_precision": precision, "column": column, "tail": tail,
             "bound": bound, "seeds": list(matrix.seeds),
             "bf16_spread": spread, "recipes": recipes, "missing": missing,
             "nonfinite": nonfinite, "modes": modes, "probes": probes,
             "contrasts": [contrast(recipes, a, b) for a, b in contrasts]}
  if one_step is not None:
    summary["one_step"] = one_step_ranking.agreement(one_step_ranking.load(one_step), summary)
  results_io.write_json(out / "summary.json", _json_safe(summary))
  (out / "summary.md").write_text(render(summary))
  return summary


def _json_safe(obj):
  """``obj`` with non-finite floats as None and int dict keys as strings (strict JSON)."""
  if isinstance(obj, dict):
    return {str(k): _json_safe(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_json_safe(v) for v in obj]
  if isinstance(obj, float) and not math.isfinite(obj):
    return None
  return obj


def _pct(v: float) -> str:
  return "n/a" if not math.isfinite(v) else f"{100 * v:+.2f}%"


def _evaluated(summary: dict[str, Any]) -> str:
  """How the runs' loss was evaluated, in words (summaries from before the key: trained)."""
  column = summary.get("column") or summary["metric"]
  if summary.get("eval_precision") == "bf16":
    return (f"evaluated in BF16 (`{column}`: the model's BF16 forward of each logged batch "
            "at the params before its update, the runs trained in their recipes)")
  if column.startswith(evaluation.PREFIX):
    return (f"evaluated in the training precision (`{column}`: each recipe's forward of each "
            "logged batch at the params before its update)")
  return f"evaluated in the training precision (`{column}`: the training forward's loss)"


def render(summary: dict[str, Any]) -> str:
  """The summary as markdown: one row per recipe."""
  lines = [f"Tail mean of {summary['metric']} over the last {summary['tail']:.0%} of the "
           f"logged steps, {_evaluated(summary)}; gap = (loss - loss_bf16) / loss_bf16 of "
           f"the same seed, mean [95% t-interval] over seeds {summary['seeds']}. BF16's "
           f"seed-to-seed spread (relative sd of its tail means): "
           f"{_pct(summary['bf16_spread'])}. Verdict against +-{summary['bound']:.2%}. GPU "
           f"mode of the runs: "
           + (", ".join(f"{m} ({n})" for m, n in sorted(summary.get("modes", {}).items()))
              or "none finished")
           + " (docs/determinism.md: a default-mode run differs from itself by about 0.1% "
           "at the validation size).", "",
           "| recipe | seeds | tail mean | gap to BF16 | gap / BF16 spread | verdict |",
           "|---|---|---|---|---|---|"]
  for recipe, r in summary["recipes"].items():
    gap = Stat(**r["gap"])
    tails = [v for v in r["tail"].values() if math.isfinite(v)]
    ci = f"[{_pct(gap.lo)}, {_pct(gap.hi)}]" if gap.has_ci else "(no interval)"
    lines.append(f"| {recipe} | {len(r['tail'])} | "
                 f"{np.mean(tails) if tails else math.nan:.4f} | "
                 f"{'-' if recipe == REFERENCE else _pct(gap.mean) + ' ' + ci} | "
                 f"{'-' if recipe == REFERENCE else format(r['gap_over_spread'], '.2g')} | "
                 f"{r['verdict']} |")
  if summary.get("contrasts"):
    lines += ["", "Contrasts: gap(a) - gap(b) per seed, mean [95% t-interval] over seeds.", "",
              "| a | b | seeds | gap(a) - gap(b) | verdict |", "|---|---|---|---|---|"]
    for c in summary["contrasts"]:
      d = Stat(**c["diff"])
      ci = f"[{_pct(d.lo)}, {_pct(d.hi)}]" if d.has_ci else "(no interval)"
      lines.append(f"| {c['a']} | {c['b']} | {d.n} | {_pct(d.mean)} {ci} | {c['verdict']} |")
  if summary.get("probes"):
    lines += ["", "Gradient-to-quantization-noise ratio ||g_bf16|| / ||g - g_bf16|| along the "
              "runs (train.noise_probe_every); arXiv 2505.19115: FP4 training stops improving "
              "below sqrt(3) = 1.73.", "",
              "| recipe | seed | first | last | first step below sqrt(3) | LM loss drop after |",
              "|---|---|---|---|---|---|"]
    for recipe, seeds in summary["probes"].items():
      for seed, p in seeds.items():
        cross = "never" if p["cross_step"] is None else str(p["cross_step"])
        drop = "-" if p["cross_step"] is None else f"{p['lm_drop_after']:.4f}"
        lines.append(f"| {recipe} | {seed} | {p['first']:.2f} | {p['last']:.2f} | {cross} | "
                     f"{drop} |")
  if summary.get("one_step"):
    lines += ["", *one_step_ranking.markdown(summary["one_step"])]
  for key, text in (("missing", "not finished"), ("nonfinite", "non-finite, left out")):
    if summary[key]:
      lines += ["", f"Runs {text}: {', '.join(summary[key])}."]
  return "\n".join(lines) + "\n"
