"""Overlay of several full training runs: loss, relative loss error, norms (report.md + PNGs).

    runs = [load_run("out/bf16"), load_run("out/fp8")]
    res = compare(runs, reference=0)     # aligned on the common logged steps
    res["runs"]["moe@all:e4m3"]["final_rel_err"]   # Stat(mean, lo, hi, n, ...)
    write_report(runs, "out/cmp")        # out/cmp/report.md and out/cmp/*.png

A run is the folder of ``python -m fp8jax.experiments.train``: ``config.json`` and
``metrics.jsonl`` (one row per logged step, :mod:`fp8jax.train.metrics_log`). Losses are in
nats per token; the relative loss error ``(loss - loss_ref) / loss_ref`` is dimensionless
(a fraction; the report shows it in percent). Non-finite losses are listed, never averaged.
matplotlib is imported only when drawing.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import json
import math
import pathlib
from typing import Any

import numpy as np

from fp8jax.data import folder_lock
from fp8jax.study.common.stats import Stat, mean_ci
from fp8jax.study.comparison import figures
from fp8jax.train import determinism

SAME_KEYS = ("model", "model_overrides", "data")
"""Config groups that runs must share to be compared (unless ``allow_mismatch``)."""

DEEPSEEK_V3_BOUND = 0.0025
"""The relative loss error DeepSeek-V3 reports for FP8 vs BF16 training (0.25%)."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run: ``rows`` sorted by step, one per step; ``notes`` on what was fixed."""

  name: str
  workdir: pathlib.Path
  config: dict
  rows: list[dict]
  notes: tuple[str, ...] = ()

  @property
  def policy(self) -> str:
    return str(self.config.get("policy", ""))

  @property
  def steps(self) -> list[int]:
    return [r["step"] for r in self.rows]

  def series(self, key: str, steps: Sequence[int] | None = None) -> np.ndarray:
    """float64 values of ``key`` at ``steps`` (default: every row); NaN where absent."""
    by = {r["step"]: r for r in self.rows}
    steps = self.steps if steps is None else steps
    return np.array([_float(by.get(s, {}).get(key)) for s in steps], np.float64)


def _float(v: Any) -> float:
  return math.nan if v is None else float(v)


def load_run(workdir) -> Run:
  """Reads a training run's folder.

  A torn last line (no trailing newline: a killed process) is skipped and noted. A row whose
  step is not past the previous row's restarts the log there (a resume): the earlier rows
  from that step on are dropped, as a resumed run truncates its log, and noted.

  Raises:
    FileNotFoundError: ``workdir`` lacks ``config.json`` or ``metrics.jsonl``.
    ValueError: a corrupt line (file and line number named) or no logged step.
  """
  workdir = pathlib.Path(workdir)
  cfg_path, log_path = workdir / "config.json", workdir / "metrics.jsonl"
  missing = [p.name for p in (cfg_path, log_path) if not p.is_file()]
  if missing:
    raise FileNotFoundError(f"{workdir} is not a training run's folder (no "
                            f"{' or '.join(missing)}; python -m fp8jax.experiments.train "
                            "writes them)")
  try:
    config = json.loads(cfg_path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{cfg_path}: not valid JSON ({e})") from None
  text = log_path.read_text()
  lines = text.splitlines()
  rows, notes, dropped = [], [], 0
  for i, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      if i == len(lines) and not text.endswith("\n"):
        notes.append(f"skipped the torn last line {i} of {log_path}")
        continue
      raise ValueError(f"{log_path}:{i}: corrupt metrics line ({e.msg}): {line[:80]!r}"
                       ) from None
    if not isinstance(row, dict) or not isinstance(row.get("step"), int) or "loss" not in row:
      raise ValueError(f"{log_path}:{i}: corrupt metrics line (needs an integer 'step' and a "
                       f"'loss'): {line[:80]!r}")
    while rows and rows[-1]["step"] >= row["step"]:
      rows.pop()
      dropped += 1
    rows.append(row)
  if dropped:
    notes.append(f"dropped {dropped} rows of {log_path} logged again after a resume "
                 "(kept the last)")
  if not rows:
    raise ValueError(f"{log_path} holds no logged step")
  return Run(str(config.get("policy") or workdir.name), workdir, config, rows, tuple(notes))


def _as_runs(runs) -> list[Run]:
  return [r if isinstance(r, Run) else load_run(r) for r in runs]


def _flat(d: Any, prefix: str) -> dict[str, Any]:
  if not isinstance(d, dict):
    return {prefix: d}
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}.{k}"))
  return out or {prefix: {}}


def mismatches(runs: Sequence[Run], reference: int = 0) -> dict[str, dict[str, Any]]:
  """``{dotted key: {run name: value}}`` of the :data:`SAME_KEYS` entries that differ from
  the reference run's."""
  flat = [{k: v for g in SAME_KEYS for k, v in _flat(r.config.get(g), g).items()} for r in runs]
  keys = sorted({k for f in flat for k in f})
  return {k: {r.name: f.get(k) for r, f in zip(runs, flat)} for k in keys
          if any(f.get(k) != flat[reference].get(k) for f in flat)}


def _unique_names(runs: list[Run]) -> list[Run]:
  """Runs with distinct names: a shared name gets its folder name appended."""
  names = [r.name for r in runs]
  return [dataclasses.replace(r, name=f"{r.name} [{r.workdir.name}]")
          if names.count(r.name) > 1 else r for r in runs]


def tail_count(n_steps: int, tail: float) -> int:
  """The number of last common steps averaged: ``ceil(tail * n_steps)``, at least 1."""
  return max(1, min(n_steps, math.ceil(tail * n_steps - 1e-9)))


METRICS = ("loss", "lm_loss")
"""The losses a comparison can be on: the training objective (LM + balance loss) or the
LM loss alone."""


def compare(runs, reference: int = 0, tail: float = 0.1, allow_mismatch: bool = False,
            metric: str = "loss") -> dict[str, Any]:
  """Aligns runs (:class:`Run` or folders) on their common logged steps; ``metric`` (one of
  :data:`METRICS`) is the loss that ``loss``, ``final_loss`` and the errors are of.

  Returns ``{"reference", "names", "steps" (common), "tail", "tail_steps", "mismatch",
  "nonfinite": [(step, name)], "runs": {name: {...}}}``; per run: ``policy``, ``workdir``,
  ``steps`` / ``loss`` / ``grad_norm`` / ``weight_norm`` (its own logged steps; nats per
  token and L2 norms), ``last_step``, ``final_loss`` (at the last common step), ``rel_err``
  (per common step; NaN where either loss is non-finite), ``final_rel_err`` (:class:`Stat`:
  the mean of ``rel_err`` over the tail steps with a 95% t-interval over them),
  ``skipped_steps`` (last logged value or None), ``loss_scale`` (per own step or None) and
  ``notes``.

  Raises:
    ValueError: fewer than two runs, a bad ``reference`` or ``tail``, no common step, or
      runs that differ in model or data (the key named) without ``allow_mismatch``.
  """
  if metric not in METRICS:
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
  runs = _unique_names(_as_runs(runs))
  if len(runs) < 2:
    raise ValueError(f"compare needs at least two runs, got {len(runs)}")
  if not 0 <= reference < len(runs):
    raise ValueError(f"reference must index one of the {len(runs)} runs, got {reference}")
  if not 0 < tail <= 1:
    raise ValueError(f"tail must be a fraction in (0, 1], got {tail}")
  diff = mismatches(runs, reference)
  if diff and not allow_mismatch:
    key, vals = next(iter(diff.items()))
    values = ", ".join(f"{n}: {v!r}" for n, v in vals.items())
    raise ValueError(f"the runs differ in {', '.join(diff)} ({key} of {values}); pass "
                     "allow_mismatch (--allow_mismatch) to compare them anyway")
  ref = runs[reference]
  steps = sorted(set.intersection(*(set(r.steps) for r in runs)))
  if not steps:
    raise ValueError(f"the runs share no logged step ({', '.join(r.name for r in runs)})")
  n_tail = tail_count(len(steps), tail)
  ref_loss = ref.series(metric, steps)
  out = {"metric": metric, "reference": ref.name, "names": [r.name for r in runs],
         "steps": steps, "tail": tail, "tail_steps": steps[-n_tail:], "mismatch": diff,
         "nonfinite": [], "runs": {}}
  for r in runs:
    loss = r.series(metric, steps)
    ok = np.isfinite(loss) & np.isfinite(ref_loss) & (ref_loss != 0)
    rel = np.full(len(steps), math.nan)
    rel[ok] = (loss[ok] - ref_loss[ok]) / ref_loss[ok]
    bad = [s for s, v in zip(r.steps, r.series(metric)) if not math.isfinite(v)]
    out["nonfinite"] += [(s, r.name) for s in bad]
    skipped = [row["skipped_steps"] for row in r.rows if row.get("skipped_steps") is not None]
    has_scale = any(row.get("loss_scale") is not None for row in r.rows)
    out["runs"][r.name] = {
        "policy": r.policy, "workdir": str(r.workdir), "steps": r.steps,
        "loss": r.series(metric), "grad_norm": r.series("grad_norm"),
        "weight_norm": r.series("weight_norm/global"), "last_step": r.steps[-1],
        "final_loss": float(loss[-1]), "rel_err": rel,
        "final_rel_err": mean_ci(rel[-n_tail:], int((~ok[-n_tail:]).sum())),
        "skipped_steps": int(skipped[-1]) if skipped else None,
        "loss_scale": r.series("loss_scale") if has_scale else None, "notes": r.notes}
  out["nonfinite"].sort()
  return out


def _pct(v: float, sign: bool = True) -> str:
  return "n/a" if not math.isfinite(v) else f"{100 * v:{'+' if sign else ''}.3g}%"


def fmt_rel(s: Stat) -> str:
  """A relative error Stat in percent: ``+0.012% [-0.003%, +0.027%] (n=3)``."""
  if not s.n:
    return "n/a"
  ci = f" [{_pct(s.lo)}, {_pct(s.hi)}]" if s.has_ci else ""
  return f"{_pct(s.mean)}{ci} (n={s.n})"


def within_bound(s: Stat, bound: float) -> str:
  """"yes" / "no" for ``|mean| < bound``; notes a CI that reaches past the bound."""
  if not s.n or not math.isfinite(s.mean):
    return "n/a"
  if abs(s.mean) >= bound:
    return "no"
  return "yes" if not s.has_ci or max(abs(s.lo), abs(s.hi)) < bound else "yes (CI reaches it)"


# --- figures ----------------------------------------------------------------------------


def _lines(ax, res, key: str, names, log: bool = False) -> None:
  for n in names:
    r = res["runs"][n]
    ax.plot(r["steps"], r[key], marker="o", ms=2, label=n)
  vals = np.concatenate([np.asarray(res["runs"][n][key]) for n in names] or [np.zeros(0)])
  vals = vals[np.isfinite(vals)]
  if log and vals.size and (vals > 0).all():
    ax.set_yscale("log")
  if names:
    ax.legend(fontsize=7)


def draw(res: dict, runs: Sequence[Run], out, bound: float = DEEPSEEK_V3_BOUND
         ) -> dict[str, pathlib.Path]:
  """The figures of a :func:`compare` result into ``out``: ``{name: png path}``."""
  names, ref = res["names"], res["reference"]
  paths = {}
  fig, (ax,) = figures._figure(1, size=(7.0, 4.5))
  _lines(ax, res, "loss", names)
  ax.set(xlabel="step", ylabel="loss (nats/token)", title="Training loss")
  paths["loss"] = figures._save(fig, out, "loss")

  fig, (ax,) = figures._figure(1, size=(7.0, 4.5))
  ax.axhspan(-100 * bound, 100 * bound, color="tab:green", alpha=0.15,
             label=f"±{100 * bound:.3g}% (DeepSeek-V3)")
  ax.axvspan(res["tail_steps"][0], res["tail_steps"][-1], color="grey", alpha=0.15,
             label="tail (final error)")
  for n in names:
    if n != ref:
      ax.plot(res["steps"], 100 * res["runs"][n]["rel_err"], marker="o", ms=2, label=n)
  ax.axhline(0, color="k", lw=0.8)
  ax.set(xlabel="step", ylabel="relative loss error (%)",
         title=f"(loss - loss_ref) / loss_ref, reference {ref}")
  ax.legend(fontsize=7)
  paths["rel_loss_error"] = figures._save(fig, out, "rel_loss_error")

  for key, title in (("grad_norm", "Gradient norm"), ("weight_norm", "Global weight norm")):
    fig, (ax,) = figures._figure(1, size=(7.0, 4.5))
    _lines(ax, res, key, names, log=key == "grad_norm")
    ax.set(xlabel="step", ylabel="L2 norm", title=title)
    paths[key] = figures._save(fig, out, key)

  modules = [k for k in dict.fromkeys(k for r in runs for row in r.rows for k in row)
             if k.startswith("weight_norm/") and k != "weight_norm/global"]
  if modules:
    fig, axes = figures._figure(len(modules), ncols=4, size=(4.2, 3.2))
    for ax, k in zip(axes, modules):
      for r in runs:
        ax.plot(r.steps, r.series(k), marker="o", ms=2, label=r.name)
      ax.set(title=k.split("/", 1)[1], xlabel="step", ylabel="L2 norm")
    axes[0].legend(fontsize=6)
    fig.suptitle("Weight norm per module")
    paths["module_weight_norms"] = figures._save(fig, out, "module_weight_norms")

  scaled = [r for r in runs if any(k in row for row in r.rows
                                   for k in ("loss_scale", "skipped_steps"))]
  if scaled:
    fig, axes = figures._figure(2, ncols=2, size=(6.0, 4.0))
    for r in scaled:
      axes[0].plot(r.steps, r.series("loss_scale"), marker="o", ms=2, label=r.name)
      axes[1].plot(r.steps, r.series("skipped_steps"), marker="o", ms=2, label=r.name)
    axes[0].set(title="loss scale", xlabel="step", yscale="log")
    axes[1].set(title="skipped steps (as logged)", xlabel="step")
    axes[0].legend(fontsize=7)
    paths["loss_scale"] = figures._save(fig, out, "loss_scale")
  return paths


# --- report -----------------------------------------------------------------------------


def _table(header, rows) -> list[str]:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]


def _precision_changes(config: dict) -> dict:
  """The run's ``precision`` settings that differ from the defaults (FP32 state, no loss
  scaling, no FP8 gather)."""
  from fp8jax.train import run_config  # pylint: disable=import-outside-toplevel
  defaults = dict(run_config.defaults().precision)
  return {k: v for k, v in (config.get("precision") or {}).items() if defaults.get(k) != v}


def render(res: dict, runs: Sequence[Run], paths: dict[str, str],
           bound: float = DEEPSEEK_V3_BOUND) -> str:
  """The report.md text (``paths``: {figure name: path relative to report.md})."""
  ref, steps, tail = res["reference"], res["steps"], res["tail_steps"]
  skips = any(res["runs"][n]["skipped_steps"] is not None for n in res["names"])
  lines = ["# Training run comparison", "",
           f"Reference: `{ref}`. Loss: "
           + ("the training objective (LM + balance loss)" if res.get("metric", "loss") == "loss"
              else "the LM loss alone (`lm_loss`)")
           + f", nats per token. Common logged steps: {len(steps)} ({steps[0]} to "
           f"{steps[-1]}); final losses are at step {steps[-1]}.", ""]
  header = ["run", "policy expression", "steps", "final loss", "final relative loss error "
            "[95% CI]", f"abs error < {_pct(bound, False)}"] + (["skipped steps"] if skips else [])
  rows = []
  for r in runs:
    x = res["runs"][r.name]
    changed = _precision_changes(r.config)
    expr = f"`{r.policy}`" + (f" precision `{json.dumps(changed)}`" if changed else "")
    err = ("reference", "-") if r.name == ref else (fmt_rel(x["final_rel_err"]),
                                                     within_bound(x["final_rel_err"], bound))
    skip = [] if not skips else [x["skipped_steps"] if x["skipped_steps"] is not None else "-"]
    loss = f"{x['final_loss']:.4f}" if math.isfinite(x["final_loss"]) else "non-finite"
    rows.append([r.name, expr, x["last_step"], loss, *err, *skip])
  lines += _table(header, rows)
  lines += [f"The final relative loss error is the mean of (loss - loss_ref) / loss_ref over "
            f"the last {res['tail']:.0%} of the common logged steps, at least one step: "
            f"{len(tail)} step(s), {tail[0]} to {tail[-1]}. Its 95% Student-t interval is over "
            "those steps, which are consecutive points of one run, not independent samples: "
            "it measures step-to-step noise, not seed-to-seed variation. The bound is the "
            f"{_pct(bound, False)} relative loss error that DeepSeek-V3 reports for its FP8 "
            "training against BF16.", ""]
  if skips:
    lines += ["Skipped steps: the last logged `skipped_steps` of the run (FP16 loss "
              "scaling).", ""]
  lines += ["## Runs", ""]
  lines += _table(["run", "folder", "logged steps", "seed", "mode", "notes"],
                  [[r.name, f"`{r.workdir}`", len(r.rows), r.config.get("seed", "n/a"),
                    determinism.mode_of(r.config),
                    "; ".join(r.notes) or "-"] for r in runs])
  if any(determinism.mode_of(r.config) == "default" for r in runs):
    lines += ["Mode: a run in the default mode on a GPU differs from itself from run to run "
              "(two runs of one 2-layer config at the 2B widths on an H100 were 1.5% apart in "
              "LM loss over steps 21-50 and 3% over steps 51-100, docs/determinism.md); a gap "
              "smaller than that between such runs cannot be told from the hardware's "
              "reduction order. `train.deterministic=True` removes it on a GPU.", ""]
  if res["mismatch"]:
    lines += ["**Warning**: compared with allow_mismatch although the runs differ in "
              + ", ".join(f"`{k}`" for k in res["mismatch"]) + ".", ""]
  lines += ["## Non-finite losses", "",
            "Excluded from every mean and CI." if res["nonfinite"] else "None.", ""]
  if res["nonfinite"]:
    lines += _table(["step", "run"], res["nonfinite"])
  lines += ["## Figures", ""] + [f"![{k}]({v})" for k, v in paths.items()] + [""]
  return "\n".join(lines)


def write_report(runs, out, bound: float = DEEPSEEK_V3_BOUND, reference: int = 0,
                 tail: float = 0.1, allow_mismatch: bool = False,
                 metric: str = "loss") -> pathlib.Path:
  """Writes ``out/report.md`` and its PNG figures (``out/*.png``) comparing ``runs``
  (:class:`Run` or folders); returns the path of report.md. ``bound``: the relative loss
  error (fraction) the table checks against."""
  runs = _unique_names(_as_runs(runs))
  res = compare(runs, reference, tail, allow_mismatch, metric)
  out = pathlib.Path(out)
  with folder_lock.hold(out):  # one writer
    paths = draw(res, runs, out, bound)
    path = out / "report.md"
    path.write_text(render(res, runs, {k: v.relative_to(out).as_posix()
                                       for k, v in paths.items()}, bound))
  return path
