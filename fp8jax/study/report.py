"""The report of a precision comparison sweep: ``report.md`` and its figures.

:func:`write_report` loads a sweep folder (:mod:`fp8jax.study.results`), computes the
statistics (:mod:`fp8jax.study.stats`) and the answers to the study's four questions
(:mod:`fp8jax.study.questions`), draws the figures (:mod:`fp8jax.study.figures`;
matplotlib is imported only when drawing) and writes ``report.md``: the grid, the
non-finite FP8 rows (listed, never averaged) and, apart from them, the non-finite BF16
baselines (a data problem), the per-policy summary, the four answers, the
figures and the method. Means over the evaluation batches come with 95% Student-t
intervals. Given the folder of the branch-off study (``branch=``, or found at
``<folder>/../branch/branches.jsonl``, the pipeline's layout), the report also answers "Does
the one-step perturbation predict the trajectory?" (:mod:`fp8jax.study.trajectory`).
Typical notebook use::

    res = results.load("out/compare")
    stats.summary(res, "rel_err")[("moe_l0_e4m3", 1000)]   # Stat(mean, lo, hi, n, ...)
    questions.answers(res)["format"]["summary"]
    report.write_report("out/compare")                        # report.md + figures/
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
import pathlib
from typing import Any

from fp8jax.study import figures, questions, trajectory, trajectory_figures
from fp8jax.study.results import Results, load, parse_seed_name
from fp8jax.study.stats import fmt, fmt_stat, stat

SUMMARY_METRICS = ("rel_err", "diff_norm", "cosine", "loss_rel_err", "share_direct")
"""Metrics of the per-policy summary table."""


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]


def _direct_text(pairs: list[tuple[str, int | None]]) -> str:
  by = defaultdict(list)
  for m, lay in pairs:
    by[m].append("all" if lay is None else str(lay))
  return ", ".join(f"{m}@{','.join(v)}" for m, v in by.items()) or "none"


def grid_markdown(res: Results) -> list[str]:
  """The sweep's identity, grid, windows, row counts and non-finite rows (markdown lines)."""
  meta, w = res.meta, res.meta.get("windows", {})
  model = ", ".join(f"{k}={v}" for k, v in meta.get("model", {}).items())
  lines = ["# Precision comparison report", "",
           f"Sweep `{res.folder}`; code version `{meta.get('code_version', 'n/a')}`; "
           f"training run `{meta.get('train_workdir', 'n/a')}`.", "",
           "## Grid", "", f"Model: {model or 'n/a'}.", "",
           f"Checkpoints (steps): {', '.join(str(s) for s in res.steps)}.", "",
           f"Evaluation windows: offsets {w.get('offsets')} (in batches), {w.get('batches')} "
           f"batches per offset, batch size {w.get('batch_size')}, sequence length "
           f"{w.get('seq_len')} (0: the training run's).", ""]
  grid = []
  for p in res.policies:
    parsed = parse_seed_name(p) or ("", "", "")
    grid.append([p, f"`{meta['policies'][p].get('expr', '')}`", *parsed,
                 _direct_text(res.direct(p))])
  lines += _table(["policy", "expression", "module", "depth", "format", "direct modules"],
                  grid)
  bad = res.nonfinite()
  expected = len(res.steps) * len(w.get("offsets") or [0]) * int(w.get("batches") or 0)
  lines += [f"Rows: {len(res.rows)} ({len(res.rows) - len(bad)} finite, {len(bad)} "
            f"non-finite) of {expected * len(res.policies)} expected "
            f"({expected} batches x {len(res.policies)} policies).", "",
            "## Non-finite rows", "",
            "Excluded from every mean, CI and ranking below." if bad else "None.", ""]
  if bad:
    lines += _table(["step", "offset", "batch", "policy", "non-finite"],
                    [[r["step"], r["offset"], r["batch"], r["policy"], r.get("nonfinite")]
                     for r in bad])
  base_bad = res.baseline_nonfinite()
  if base_bad:
    lines += ["## Non-finite BF16 baselines (data problem)", "",
              f"The BF16 reference itself is non-finite on these {len(base_bad)} (checkpoint, "
              "batch) pairs: the checkpoint or the batch is bad, not FP8, and no FP8 row is "
              "compared against them (`python -m fp8jax.experiments.verify "
              "--workdir=<training run>` checks the checkpoints).", ""]
    lines += _table(["step", "offset", "batch", "non-finite"],
                    [[b["step"], b["offset"], b["batch"], b.get("nonfinite")] for b in base_bad])
  return lines


def summary_markdown(res: Results) -> list[str]:
  """Per-policy means pooled over checkpoints and batches, and rel_err per checkpoint."""
  lines = ["## Summary per policy", "",
           "Mean [95% CI] over all finite (checkpoint, batch) rows; CIs are t-intervals "
           "over those rows.", ""]
  rows = []
  for p in res.policies:
    st = {m: stat(res, m, p) for m in SUMMARY_METRICS}
    rows.append([p, st["rel_err"].n, st["rel_err"].n_nonfinite,
                 *(fmt_stat(st[m], n=False) for m in SUMMARY_METRICS)])
  lines += _table(["policy", "finite rows", "non-finite", *SUMMARY_METRICS], rows)
  lines += ["Relative gradient error per checkpoint, mean +- 95% CI half-width over the "
            "batches:", ""]
  cells = []
  for p in res.policies:
    row = [p]
    for s in res.steps:
      st = stat(res, "rel_err", p, [s])
      row.append(fmt(st.mean) + (f" +- {fmt(st.hi - st.mean)}" if st.has_ci else ""))
    cells.append(row)
  return lines + _table(["policy", *(str(s) for s in res.steps)], cells)


def render(res: Results, ans: dict[str, dict], figures: dict[str, Any],
           extra: Sequence[str] = ()) -> str:
  """The full report.md text (``figures``: {name: path relative to report.md}; ``extra``:
  markdown lines of further sections, after the answers)."""
  lines = grid_markdown(res) + summary_markdown(res) + questions.markdown(ans, figures)
  lines += list(extra)
  lines += ["## Figures", ""] + [f"![{k}]({v})" for k, v in figures.items()] + [""]
  lines += ["## Method", "",
            "Each row pairs the BF16 gradient of a checkpoint and batch with an FP8 policy's "
            "gradient on the same batch. Means are over the evaluation batches (all offsets); "
            "CIs are two-sided 95% Student-t intervals (no CI for a single batch). Paired "
            "differences use the batches where both policies are finite. Trajectory shapes "
            "compare the first third of the checkpoints with the last third.", ""]
  return "\n".join(lines)


def branch_folder(folder: str | pathlib.Path) -> pathlib.Path | None:
  """The branch-off study next to a sweep folder (``<folder>/../branch`` when it holds
  ``branches.jsonl``), else None."""
  found = pathlib.Path(folder).resolve().parent / "branch"
  return found if (found / "branches.jsonl").exists() else None


def write_report(folder: str | pathlib.Path, out: str | pathlib.Path | None = None,
                 top_k: int = 10, branch: str | pathlib.Path | None = None,
                 find_branch: bool = True, n_boot: int = 2000) -> pathlib.Path:
  """Writes ``report.md`` and its figures (``figures/*.png``) into ``out`` (default:
  ``folder``); returns the path of report.md.

  ``branch``: the branch-off study's folder for the trajectory section (default: the one
  :func:`branch_folder` finds, when ``find_branch``); ``n_boot``: its bootstrap resamples.
  """
  res = load(folder)
  branch = branch or (branch_folder(folder) if find_branch else None)
  out = pathlib.Path(out or folder)
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
  path = out / "report.md"
  path.write_text(render(res, ans, {k: v.relative_to(out).as_posix() for k, v in paths.items()},
                         extra))
  return path
