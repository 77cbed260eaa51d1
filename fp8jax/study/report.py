"""Report of a precision comparison sweep: loading, statistics and the four study answers.

A sweep folder (:mod:`fp8jax.study.sweep`) holds ``meta.json``, ``rows.jsonl`` (metrics per
checkpoint step, evaluation batch and FP8 policy), ``details.jsonl`` (per-parameter and
module x layer gradient difference norms), ``baseline.jsonl`` (BF16 losses per batch) and
``weights.jsonl`` (baseline weight norms per step). Norms are L2 norms of gradients (loss
units per parameter unit), ``rel_err`` = ||g_fp8 - g_bf16|| / ||g_bf16|| and
``loss_rel_err`` are dimensionless, losses are in nats per token.

Rows with ``finite: false`` are counted and listed, never averaged; NaN values of finite
rows (undefined ratios) are left out of their metric's mean and counted. Means over the
evaluation batches come with 95% Student-t intervals. Typical notebook use::

    res = report.load("out/compare")
    report.summary(res, "rel_err")[("moe_l0_e4m3", 1000)]   # Stat(mean, lo, hi, n, ...)
    report.answers(res)["format"]["summary"]
    report.write_report("out/compare")                         # report.md + figures/

The answers to the study's four questions are computed by :mod:`fp8jax.study.questions` and
the figures drawn by :mod:`fp8jax.study.figures` (matplotlib is imported only when drawing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
import dataclasses
import json
import math
import pathlib
import re
from typing import Any

import numpy as np

FILES = ("meta.json", "rows.jsonl", "details.jsonl", "baseline.jsonl", "weights.jsonl")
"""The files of a sweep folder."""

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30; 1.96 beyond.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_SEED_NAME = re.compile(r"^(attn|moe)_(l\d+(?:-\d+)?)_(e4m3|e5m2)$")


def t_quantile(df: int) -> float:
  """The 97.5% quantile of Student's t with ``df`` degrees of freedom (1.96 past 30)."""
  if df < 1:
    raise ValueError(f"df must be >= 1, got {df}")
  return _T975[df - 1] if df <= len(_T975) else 1.96


def parse_seed_name(name: str) -> tuple[str, str, str] | None:
  """``(module, depth, fmt)`` of a seed-grid policy name, e.g. ``"moe_l0-8_e5m2"`` ->
  ``("moe", "l0-8", "e5m2")``; None for other names."""
  m = _SEED_NAME.match(name)
  return (m.group(1), m.group(2), m.group(3)) if m else None


def depth_layers(depth: str) -> int:
  """How many layers a depth label covers: ``"l0"`` -> 1, ``"l0-8"`` -> 9."""
  lo, _, hi = depth[1:].partition("-")
  return int(hi or lo) - int(lo) + 1


# --- loading -----------------------------------------------------------------------------

def read_jsonl(path: str | pathlib.Path) -> list[dict]:
  """The objects of a JSONL file; a torn (unparsable) last line is dropped.

  Raises:
    FileNotFoundError: the file does not exist.
    ValueError: a line other than the last is not a JSON object.
  """
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"sweep file {path.name} not found in {path.parent}")
  lines = [(i, s) for i, s in enumerate(path.read_text().splitlines(), 1) if s.strip()]
  out = []
  for j, (i, line) in enumerate(lines):
    try:
      obj = json.loads(line)
    except json.JSONDecodeError:
      obj = None
    if not isinstance(obj, dict):
      if j == len(lines) - 1:
        break
      raise ValueError(f"{path}:{i}: not a JSON object")
    out.append(obj)
  return out


def _key(row: dict) -> tuple:
  return (int(row["step"]), int(row["offset"]), int(row["batch"]), row["policy"])


@dataclasses.dataclass
class Results:
  """A loaded sweep: ``meta`` and the lines of each JSONL file (dicts; later duplicates of
  one (step, offset, batch, policy) replace earlier ones)."""

  folder: pathlib.Path
  meta: dict
  rows: list[dict]
  details: list[dict]
  baseline: list[dict]
  weights: list[dict]

  def __post_init__(self):
    self._by = defaultdict(list)
    for r in self.rows:
      self._by[(r["policy"], int(r["step"]))].append(r)
    finite = {_key(r) for r in self.rows if r["finite"]}
    self._details = defaultdict(list)
    for d in self.details:
      if _key(d) in finite:
        self._details[(d["policy"], int(d["step"]))].append(d)

  @property
  def policies(self) -> list[str]:
    """Policy names in the order of ``meta.json``."""
    return list(self.meta["policies"])

  @property
  def steps(self) -> list[int]:
    """Checkpoint steps, ascending."""
    return sorted(int(s) for s in self.meta["steps"])

  def rows_of(self, policy: str, steps: Iterable[int] | None = None) -> list[dict]:
    """The rows (finite or not) of one policy at ``steps`` (default: all)."""
    return [r for s in (self.steps if steps is None else steps) for r in self._by[(policy, s)]]

  def details_of(self, policy: str, step: int) -> list[dict]:
    """The details lines of one policy and step whose row is finite."""
    return self._details[(policy, int(step))]

  def nonfinite(self) -> list[dict]:
    """The rows with ``finite: false``, in (step, policy, offset, batch) order."""
    return sorted((r for r in self.rows if not r["finite"]),
                  key=lambda r: (r["step"], r["policy"], r["offset"], r["batch"]))

  def direct(self, policy: str) -> list[tuple[str, int | None]]:
    """The directly quantized ``(module, layer)`` pairs of a policy."""
    return [(m, None if lay is None else int(lay))
            for m, lay in self.meta["policies"][policy].get("direct", [])]


def _dedup(items: list[dict], key) -> list[dict]:
  return list({key(x): x for x in items}.values())


def load(folder: str | pathlib.Path) -> Results:
  """Reads a sweep folder.

  Raises:
    FileNotFoundError: a file of :data:`FILES` is missing (named in the message).
    ValueError: a line names a policy or step that ``meta.json`` does not list, or lacks
      an identifying key.
  """
  folder = pathlib.Path(folder)
  meta_path = folder / "meta.json"
  if not meta_path.exists():
    raise FileNotFoundError(f"sweep file meta.json not found in {folder}")
  meta = json.loads(meta_path.read_text())
  data = {name: read_jsonl(folder / f"{name}.jsonl")
          for name in ("rows", "details", "baseline", "weights")}
  policies, steps = set(meta["policies"]), {int(s) for s in meta["steps"]}
  need = {"rows": ("step", "offset", "batch", "policy", "finite"),
          "details": ("step", "offset", "batch", "policy"),
          "baseline": ("step", "offset", "batch"), "weights": ("step",)}
  for name, items in data.items():
    for x in items:
      missing = [k for k in need[name] if k not in x]
      if missing:
        raise ValueError(f"{name}.jsonl: a line lacks {missing}: {str(x)[:200]}")
      if int(x["step"]) not in steps:
        raise ValueError(f"{name}.jsonl: step {x['step']} is not in meta.json {sorted(steps)}")
      if "policy" in need[name] and x["policy"] not in policies:
        raise ValueError(f"{name}.jsonl: policy {x['policy']!r} is not in meta.json "
                         f"{sorted(policies)}")
  return Results(folder, meta, _dedup(data["rows"], _key), _dedup(data["details"], _key),
                 _dedup(data["baseline"], lambda x: _key({**x, "policy": None})),
                 _dedup(data["weights"], lambda x: int(x["step"])))


# --- statistics --------------------------------------------------------------------------

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
  rb = {_key({**r, "policy": None}): r for r in res.rows_of(b, steps) if r["finite"]}
  return mean_ci([float(r.get(metric, math.nan)) - float(rb[k].get(metric, math.nan))
                  for r in res.rows_of(a, steps)
                  if r["finite"] and (k := _key({**r, "policy": None})) in rb])


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


def answers(res: Results, top_k: int = 10) -> dict[str, dict]:
  """The four answers as data (see :mod:`fp8jax.study.questions`)."""
  from fp8jax.study import questions  # pylint: disable=import-outside-toplevel
  return questions.answers(res, top_k)


# --- report.md ---------------------------------------------------------------------------

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
  base_bad = [b for b in res.baseline if not b.get("finite", True)]
  if base_bad:
    lines += ["Non-finite BF16 baselines:", ""] + _table(
        ["step", "offset", "batch", "non-finite"],
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


def render(res: Results, ans: dict[str, dict], figures: dict[str, Any]) -> str:
  """The full report.md text (``figures``: {name: path relative to report.md})."""
  from fp8jax.study import questions  # pylint: disable=import-outside-toplevel
  lines = grid_markdown(res) + summary_markdown(res) + questions.markdown(ans, figures)
  lines += ["## Figures", ""] + [f"![{k}]({v})" for k, v in figures.items()] + [""]
  lines += ["## Method", "",
            "Each row pairs the BF16 gradient of a checkpoint and batch with an FP8 policy's "
            "gradient on the same batch. Means are over the evaluation batches (all offsets); "
            "CIs are two-sided 95% Student-t intervals (no CI for a single batch). Paired "
            "differences use the batches where both policies are finite. Trajectory shapes "
            "compare the first third of the checkpoints with the last third.", ""]
  return "\n".join(lines)


def write_report(folder: str | pathlib.Path, out: str | pathlib.Path | None = None,
                 top_k: int = 10) -> pathlib.Path:
  """Writes ``report.md`` and its figures (``figures/*.png``) into ``out`` (default:
  ``folder``); returns the path of report.md."""
  from fp8jax.study import figures  # pylint: disable=import-outside-toplevel
  res = load(folder)
  out = pathlib.Path(out or folder)
  fig_dir = out / "figures"
  fig_dir.mkdir(parents=True, exist_ok=True)
  ans = answers(res, top_k)
  paths = figures.write_all(res, fig_dir, ans, top_k)
  path = out / "report.md"
  path.write_text(render(res, ans, {k: v.relative_to(out).as_posix() for k, v in paths.items()}))
  return path
