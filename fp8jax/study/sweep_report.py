"""The report of a precision comparison sweep: ``report.md`` and its figures.

:func:`write_report` loads a sweep folder (:mod:`fp8jax.study.common.results`), computes the
statistics (:mod:`fp8jax.study.common.stats`) and the answers to the study's four questions
(:mod:`fp8jax.study.comparison.questions`), draws the figures
(:mod:`fp8jax.study.comparison.figures`; matplotlib is imported only when drawing) and
writes ``report.md``: the grid, the non-finite FP8 rows (listed, never averaged) and, apart
from them, the non-finite references (a data problem), the conditioning per checkpoint
(:mod:`fp8jax.study.comparison.conditioning`), the per-policy summary, every policy against
the noise floor and its noise-matched control (:mod:`fp8jax.study.comparison.floor`), the
answers, routing and experts for a model with a router
(:mod:`fp8jax.study.comparison.experts`), the figures and the method. Per checkpoint,
positive metrics are geometric means over the batches with the t-interval of the logs,
signed ones arithmetic means with t-intervals; across checkpoints, medians with bootstrap
intervals over the batches. The reference is named by its precision
(:attr:`~fp8jax.study.common.results.Results.reference`: the one the sweep recorded from the
model, BF16 for folders that recorded none). Given the folder of the branch-off study
(``branch=``, or found at ``<folder>/../branch/branches.jsonl``, the pipeline's layout), the
report also answers "Does the one-step perturbation predict the trajectory?"
(:mod:`fp8jax.study.branches.trajectory`).
Typical notebook use::

    res = results.load("out/compare")
    stats.summary(res, "rel_err")[("moe_l0_e4m3", 1000)]   # Stat(mean, lo, hi, n, ...)
    stats.overall(res, "rel_err", "moe_l0_e4m3")            # Summary(median, lo, hi, ...)
    questions.answers(res)["format"]["summary"]
    report.write_report("out/compare")                        # report.md + figures/
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
import contextlib
import json
import pathlib
from typing import Any

from fp8jax.data import folder_lock
from fp8jax.study.branches import trajectory, trajectory_figures
from fp8jax.study.common import metric_registry
from fp8jax.study.common.results import Results, load
from fp8jax.study.common.stats import fmt_stat, overall, stat, table
from fp8jax.study.comparison import conditioning, experts, figures, floor, questions
from fp8jax.study.runs import one_step_ranking

SUMMARY_METRICS = metric_registry.summary_names()
"""Metrics of the per-policy summary table (those registered with ``summary``)."""


def _direct_text(pairs: list[tuple[str, int | None]]) -> str:
  by = defaultdict(list)
  for m, lay in pairs:
    by[m].append("all" if lay is None else str(lay))
  return ", ".join(f"{m}@{','.join(v)}" for m, v in by.items()) or "none"


def reference_text(res: Results) -> str:
  """The sentence naming the reference: its precision and, where the sweep recorded it,
  its share of the GEMM multiply-adds."""
  ref = res.meta.get("reference") or {}
  share = ", ".join(f"{k.upper()} {100 * v:.4g}%"
                    for k, v in (ref.get("gemm_share") or {}).items())
  how = (f"GEMM multiply-adds: {share}" if share else "as the sweep recorded it" if ref
         else "a folder that predates the record, read as BF16")
  return (f"Reference: {res.reference}, the model's own precision (its baseline policy, "
          f"nothing quantized; {how}); every policy is compared with the {res.reference} "
          "reference.")


def grid_markdown(res: Results) -> list[str]:
  """The sweep's identity, grid, windows, row counts and non-finite rows (markdown lines)."""
  meta, w = res.meta, res.meta.get("windows", {})
  model = ", ".join(f"{k}={v}" for k, v in meta.get("model", {}).items())
  lines = ["# Precision comparison report", "",
           f"Sweep `{res.folder}`; code version `{meta.get('code_version', 'n/a')}`; "
           f"training run `{meta.get('train_workdir', 'n/a')}`.", "",
           "## Grid", "", f"Model: {model or 'n/a'}.", "", reference_text(res), "",
           f"Checkpoints (steps): {', '.join(str(s) for s in res.steps)}.", "",
           f"Evaluation windows: offsets {w.get('offsets')} (in batches), {w.get('batches')} "
           f"batches per offset, batch size {w.get('batch_size')}, sequence length "
           f"{w.get('seq_len')} (0: the training run's).", ""]
  grid = []
  for p in res.names:
    parsed = res.cell(p) or ("", "", "")
    kind = res.kind(p) + (f" of {res.controls[p]}" if p in res.controls else "")
    grid.append([p, kind, f"`{meta['policies'][p].get('expr', '')}`", *parsed,
                 _direct_text(res.direct(p))])
  lines += table(["policy", "kind", "expression", "module", "depth", "format",
                   "direct modules"], grid)
  bad = res.nonfinite()
  expected = len(res.steps) * len(w.get("offsets") or [0]) * int(w.get("batches") or 0)
  lines += [f"Rows: {len(res.rows)} ({len(res.rows) - len(bad)} finite, {len(bad)} "
            f"non-finite) of {expected * len(res.names)} expected "
            f"({expected} batches x {len(res.names)} policies, floor and controls).", "",
            "## Non-finite rows", "",
            "Excluded from every mean, CI and ranking below." if bad else "None.", ""]
  if bad:
    lines += table(["step", "offset", "batch", "policy", "non-finite"],
                    [[r["step"], r["offset"], r["batch"], r["policy"], r.get("nonfinite")]
                     for r in bad])
  base_bad = res.baseline_nonfinite()
  if base_bad:
    lines += [f"## Non-finite {res.reference} baselines (data problem)", "",
              f"The {res.reference} reference itself is non-finite on these {len(base_bad)} "
              "(checkpoint, batch) pairs: the checkpoint or the batch is bad, not FP8, and no "
              "FP8 row is compared against them (`python -m fp8jax.experiments.verify "
              "--workdir=<training run>` checks the checkpoints).", ""]
    lines += table(["step", "offset", "batch", "non-finite"],
                    [[b["step"], b["offset"], b["batch"], b.get("nonfinite")] for b in base_bad])
  return lines


def summary_markdown(res: Results) -> list[str]:
  """Per-policy medians over the checkpoints, and rel_err per checkpoint (the floor and
  the controls in their own rows)."""
  positive = [m for m in SUMMARY_METRICS if metric_registry.is_positive(m)]
  signed = [m for m in SUMMARY_METRICS if m not in positive]
  lines = ["## Summary per policy", "",
           "Median over the checkpoints of each checkpoint's center [95% bootstrap interval, "
           "resampling the batches within each checkpoint]; the center is the geometric mean "
           f"over the batches for positive metrics ({', '.join(positive)}), the "
           f"arithmetic mean for signed ones ({', '.join(signed)}).", ""]
  rows = []
  names = res.policies + ([res.floor] if res.floor else []) + list(res.controls)
  for p in names:
    st = {m: overall(res, m, p) for m in SUMMARY_METRICS}
    rows.append([p, st["rel_err"].n, st["rel_err"].n_nonfinite,
                 *(fmt_stat(st[m], n=False) for m in SUMMARY_METRICS)])
  lines += table(["policy", "finite rows", "non-finite", *SUMMARY_METRICS], rows)
  lines += ["Relative gradient error per checkpoint: geometric mean [95% t-interval of the "
            "logs] over the batches:", ""]
  cells = [[p, *(fmt_stat(stat(res, "rel_err", p, [s]), n=False) for s in res.steps)]
           for p in names]
  return lines + table(["policy", *(str(s) for s in res.steps)], cells)


def render(res: Results, ans: dict[str, dict], figures: dict[str, Any],
           extra: Sequence[str] = ()) -> str:
  """The full report.md text (``figures``: {name: path relative to report.md}; ``extra``:
  markdown lines of further sections, after the answers)."""
  lines = grid_markdown(res) + conditioning.markdown(res) + summary_markdown(res)
  lines += floor.floor_markdown(res) + floor.controls_markdown(res)
  lines += [f"![noise_floor]({figures['noise_floor']})", ""] if "noise_floor" in figures else []
  lines += questions.markdown(ans, figures)
  lines += experts.markdown(res)
  lines += list(extra)
  lines += ["## Figures", ""] + [f"![{k}]({v})" for k, v in figures.items()] + [""]
  lines += ["## Method", "", method(res.reference), ""]
  return "\n".join(lines)


def method(reference: str = "BF16") -> str:
  """The report's method paragraph, naming the reference by its precision."""
  return METHOD.format(reference=reference)


METHOD = (
    "Each row pairs the {reference} reference's gradient of a checkpoint and batch with a "
    "policy's gradient on the same batch (the noise floor: with the reference's gradient at "
    "weights perturbed at BF16 rounding level, 2^-8). Per checkpoint, over its evaluation "
    "batches (all offsets): positive quantities (norms, relative errors, ratios) are "
    "geometric means with the two-sided 95% Student-t interval of their logs, exponentiated "
    "(never below 0); signed quantities (cosines, shares) are arithmetic means with 95% "
    "t-intervals; a single batch has no interval. Across checkpoints: the median of the per-"
    "checkpoint centers (on the log scale for positive quantities) with a 95% percentile "
    "bootstrap interval (2000 resamples, seed 0) that resamples the batches within each "
    "checkpoint, their deviations from the checkpoint's mean scaled by sqrt(n / (n - 1)) so "
    "that few batches do not give too narrow an interval: the checkpoints are the design and "
    "stay fixed, the batches are the sample (no interval unless every checkpoint has at least"
    " 3 batches). Comparisons between policies are paired on the batches where both are "
    "finite: the per-batch ratio for positive metrics (so the batch's own difficulty "
    "cancels), the difference for signed ones, summarized the same way. Trajectory shapes "
    "compare the geometric mean over the first third of the checkpoints with the last third. "
    "In the trajectory section, each predictor x outcome relation has a permutation p-value "
    "(fixed seed), adjusted with Holm's method over all the pairs tested: it controls the "
    "chance of stating any false relation at 5% whatever the dependence between the "
    "predictors.")


def branch_folder(folder: str | pathlib.Path) -> pathlib.Path | None:
  """The branch-off study next to a sweep folder (``<folder>/../branch`` when it holds
  ``branches.jsonl``), else None."""
  found = pathlib.Path(folder).resolve().parent / "branch"
  return found if (found / "branches.jsonl").exists() else None


def write_report(folder: str | pathlib.Path, out: str | pathlib.Path | None = None,
                 top_k: int = 10, branch: str | pathlib.Path | None = None,
                 find_branch: bool = True, n_boot: int = 2000,
                 validation: str | pathlib.Path | None = None) -> pathlib.Path:
  """Writes ``report.md`` and its figures (``figures/*.png``) into ``out`` (default:
  ``folder``); returns the path of report.md.

  ``branch``: the branch-off study's folder for the trajectory section (default: the one
  :func:`branch_folder` finds, when ``find_branch``); ``n_boot``: its bootstrap resamples.
  ``validation``: a validation matrix's ``summary.json`` (``validate``); the trajectory
  section then ranks the sweep's policies that are recipes of the matrix against the full
  runs' mean gaps (:mod:`fp8jax.study.runs.one_step_ranking`).
  """
  res = load(folder)
  branch = branch or (branch_folder(folder) if find_branch else None)
  out = pathlib.Path(out or folder)
  # A folder of its own is locked (one writer); the results folder is not, so that a
  # report can be drawn while its sweep still runs.
  with (folder_lock.hold(out) if out.resolve() != pathlib.Path(folder).resolve()
        else contextlib.nullcontext()):
    return _write(res, out, top_k, branch, n_boot, validation)


def _write(res, out: pathlib.Path, top_k: int, branch, n_boot: int,
           validation=None) -> pathlib.Path:
  fig_dir = out / "figures"
  fig_dir.mkdir(parents=True, exist_ok=True)
  ans = questions.answers(res, top_k)
  paths = figures.write_all(res, fig_dir, ans, top_k)
  extra = []
  if branch:
    br = trajectory.load_branches(branch)
    st = trajectory.study(res, br, n_boot=n_boot)
    png = trajectory_figures.scatter(st, fig_dir).relative_to(out).as_posix()
    extra = trajectory.markdown(st, br, res, png)
  if validation:
    summary = json.loads(pathlib.Path(validation).read_text())
    extra = [*extra, "", "### Full training runs: does the one-step ranking predict them?", "",
             f"Full runs: `{validation}`.", "",
             *one_step_ranking.markdown(one_step_ranking.agreement({None: res}, summary,
                                                                  n_boot=n_boot))]
  path = out / "report.md"
  path.write_text(render(res, ans, {k: v.relative_to(out).as_posix() for k, v in paths.items()},
                         extra))
  return path
