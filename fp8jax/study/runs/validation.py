"""The validation matrix: full training runs of several recipes x seeds, resumable across
sessions, and their gaps to BF16 against BF16's own seed-to-seed spread.

    m = Matrix(recipes=("bf16", "gemm:fp32_blockwise", "gemm:nvfp4_recipe"), seeds=(0, 1, 2))
    run_matrix(base_cfg, "out/validation", m, deadline=time.monotonic() + 540)
    table = summarize("out/validation", m)          # also summary.json and summary.md

Each (recipe, seed) trains in ``<out>/runs/<recipe>_s<seed>`` with ``base_cfg`` (an
``ml_collections`` run config, :mod:`fp8jax.train.run_config`), its ``policy`` set to the
recipe and its init ``seed`` to the seed; the data order is the same for every run. A run
that finished has ``done.json`` and is skipped; one with checkpoints resumes. Runs go seed
by seed, so an interrupted matrix has whole seeds first. With a ``deadline``
(``time.monotonic()`` seconds) no run starts after it, and a running one is stopped at it as
by a preemption notice (it saves a checkpoint and the next call resumes it; runs without
checkpoints, ``train.checkpoints=False``, run to their end).

The summary: per run the mean ``metric`` over the last ``tail`` share of its logged steps
(the overlay's tail mean; nats per token); per recipe the relative gap to BF16 of the same
seed, ``(loss - loss_bf16) / loss_bf16``, with its mean and 95% t-interval over seeds, next
to BF16's own seed-to-seed spread (the relative standard deviation of the BF16 tail means):
the yardstick a gap must exceed to mean anything. A verdict against a bound (e.g. DeepSeek-V3's
0.25%) is "within" only when the whole interval lies inside it, "outside" when it lies
outside, and "cannot tell" otherwise. Non-finite runs are listed, never averaged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import math
import os
import pathlib
import re
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from fp8jax.models import policy as policy_lib
from fp8jax.study.common import results_io
from fp8jax.study.common.intervals import Stat, mean_ci
from fp8jax.study.runs.overlay import load_run, tail_count
from fp8jax.train import preemption

REFERENCE = "bf16"
DONE = "done.json"


@dataclasses.dataclass(frozen=True)
class Matrix:
  """``recipes`` (policy expressions; :data:`REFERENCE` among them) x init ``seeds``."""

  recipes: tuple[str, ...]
  seeds: tuple[int, ...]

  def __post_init__(self):
    object.__setattr__(self, "recipes", tuple(str(r).strip() for r in self.recipes))
    object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
    if REFERENCE not in self.recipes:
      raise ValueError(f"the recipes must include the reference {REFERENCE!r}, got "
                       f"{list(self.recipes)}")
    if len(set(self.recipes)) != len(self.recipes) or len(set(self.seeds)) != len(self.seeds):
      raise ValueError(f"repeated recipes or seeds: {list(self.recipes)}, {list(self.seeds)}")
    if not self.seeds or min(self.seeds) < 0:
      raise ValueError(f"seeds must be >= 0 and at least one, got {list(self.seeds)}")
    for r in self.recipes:
      policy_lib.parse_policy(r)  # an unknown recipe fails here, before any run

  def runs(self) -> list[tuple[str, int]]:
    """(recipe, seed) in the order they train: seed by seed, the reference first."""
    order = [REFERENCE] + [r for r in self.recipes if r != REFERENCE]
    return [(r, s) for s in self.seeds for r in order]


def run_name(recipe: str, seed: int) -> str:
  """The run folder's name: the recipe with characters other than ``[A-Za-z0-9.-]`` as
  ``_``, then ``_s<seed>`` (``gemm:fp32_blockwise``, 0 -> ``gemm_fp32_blockwise_s0``)."""
  return f"{re.sub(r'[^A-Za-z0-9.-]+', '_', recipe)}_s{seed}"


def _ignore_term(signum, frame) -> None:
  """The matrix's own SIGTERM handler between runs: a late deadline signal is harmless."""
  del signum, frame


def _stop_at(deadline: float | None) -> threading.Event | None:
  """From ``deadline`` on, sends this process SIGTERM once a run's preemption watch has its
  handler installed (it saves a checkpoint and stops; before, e.g. while the run compiles,
  there is nothing to save). Set the returned event to cancel."""
  if deadline is None:
    return None
  cancel = threading.Event()

  def watch():
    if cancel.wait(max(0.0, deadline - time.monotonic())):
      return
    while not cancel.is_set():
      handler = signal.getsignal(signal.SIGTERM)
      if callable(handler) and handler is not _ignore_term:
        os.kill(os.getpid(), signal.SIGTERM)
        return
      cancel.wait(0.5)

  threading.Thread(target=watch, daemon=True).start()
  return cancel


def run_matrix(base_cfg, out, matrix: Matrix, deadline: float | None = None, stream=None,
               train_fn: Callable | None = None) -> dict[str, list[str]]:
  """Trains every run of ``matrix`` not finished yet; returns the run names by outcome
  (``done``: finished now or before, ``stopped``: saved at the deadline, ``pending``: not
  started). ``train_fn``: :func:`fp8jax.train.loop.train` (replaceable in tests)."""
  if train_fn is None:
    from fp8jax.train import loop  # pylint: disable=import-outside-toplevel
    train_fn = loop.train
  stream = stream or sys.stderr
  out = pathlib.Path(out)
  outcome = {"done": [], "stopped": [], "pending": []}
  main = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, _ignore_term) if deadline and main else None
  try:
    for recipe, seed in matrix.runs():
      _one(base_cfg, out, matrix, recipe, seed, deadline, stream, train_fn, outcome)
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
  return outcome


def _one(base_cfg, out, matrix, recipe, seed, deadline, stream, train_fn, outcome) -> None:
  """Trains one run of the matrix unless done; records its outcome."""
  name = run_name(recipe, seed)
  workdir = out / "runs" / name
  if (workdir / DONE).exists():
    outcome["done"].append(name)
    return
  if deadline is not None and time.monotonic() >= deadline:
    outcome["pending"].append(name)
    return
  cfg = base_cfg.copy_and_resolve_references()
  cfg.policy, cfg.seed = recipe, seed
  print(f"[validate] {name}: {'resuming' if (workdir / 'config.json').exists() else 'start'}"
        f" ({len(outcome['done'])} of {len(matrix.runs())} done)", file=stream, flush=True)
  cancel = _stop_at(deadline)
  try:
    summary = train_fn(cfg, workdir, resume=(workdir / "config.json").exists(), stream=stream)
  except preemption.Preempted:
    outcome["stopped"].append(name)
    return
  finally:
    if cancel is not None:
      cancel.set()
  results_io.write_json(workdir / DONE, {"recipe": recipe, "seed": seed,
                                         "final_step": summary.get("final_step")})
  outcome["done"].append(name)


def tail_value(workdir, metric: str = "lm_loss", tail: float = 0.1) -> float:
  """The mean of ``metric`` over the last ``tail`` share of a run's logged steps (NaN when a
  value there is not finite)."""
  run = load_run(workdir)
  values = run.series(metric)
  values = values[-tail_count(len(values), tail):]
  return float(values.mean()) if np.all(np.isfinite(values)) else math.nan


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


def summarize(out, matrix: Matrix, metric: str = "lm_loss", tail: float = 0.1,
              bound: float = 0.0025) -> dict[str, Any]:
  """Tail values per run, gaps to BF16 per recipe over seeds, the BF16 spread; writes
  ``<out>/summary.json`` and ``<out>/summary.md``. Unfinished runs are left out and
  listed."""
  out = pathlib.Path(out)
  value, missing, nonfinite = {}, [], []
  for recipe, seed in matrix.runs():
    workdir = out / "runs" / run_name(recipe, seed)
    if not (workdir / DONE).exists():
      missing.append(run_name(recipe, seed))
      continue
    value[(recipe, seed)] = v = tail_value(workdir, metric, tail)
    if math.isnan(v):
      nonfinite.append(run_name(recipe, seed))
  ref = {s: value.get((REFERENCE, s), math.nan) for s in matrix.seeds}
  ref_ok = [v for v in ref.values() if math.isfinite(v)]
  spread = (float(np.std(ref_ok, ddof=1) / np.mean(ref_ok)) if len(ref_ok) >= 2 else math.nan)
  recipes = {}
  for recipe in matrix.recipes:
    finals = {s: value[(recipe, s)] for s in matrix.seeds if (recipe, s) in value}
    gaps = [(finals[s] - ref[s]) / ref[s] for s in finals
            if math.isfinite(finals[s]) and math.isfinite(ref[s])]
    gap = mean_ci(gaps)
    recipes[recipe] = {"tail": finals, "gaps": gaps, "gap": dataclasses.asdict(gap),
                       "verdict": "reference" if recipe == REFERENCE else verdict(gap, bound),
                       "gap_over_spread": (abs(gap.mean) / spread
                                           if spread and math.isfinite(spread) else math.nan)}
  summary = {"metric": metric, "tail": tail, "bound": bound, "seeds": list(matrix.seeds),
             "bf16_spread": spread, "recipes": recipes, "missing": missing,
             "nonfinite": nonfinite}
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


def render(summary: dict[str, Any]) -> str:
  """The summary as markdown: one row per recipe."""
  lines = [f"Tail mean of {summary['metric']} over the last {summary['tail']:.0%} of the "
           f"logged steps; gap = (loss - loss_bf16) / loss_bf16 of the same seed, mean "
           f"[95% t-interval] over seeds {summary['seeds']}. BF16's seed-to-seed spread "
           f"(relative sd of its tail means): {_pct(summary['bf16_spread'])}. Verdict "
           f"against +-{summary['bound']:.2%}.", "",
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
  for key, text in (("missing", "not finished"), ("nonfinite", "non-finite, left out")):
    if summary[key]:
      lines += ["", f"Runs {text}: {', '.join(summary[key])}."]
  return "\n".join(lines) + "\n"


def parse_seeds(text: Sequence[str]) -> tuple[int, ...]:
  """``["0", "1", "2"]`` or ``["0-2"]`` -> (0, 1, 2)."""
  seeds = []
  for part in text:
    lo, _, hi = str(part).partition("-")
    seeds.extend(range(int(lo), int(hi or lo) + 1))
  return tuple(seeds)
