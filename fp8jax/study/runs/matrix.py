"""The validation matrix's runs: several recipes x init seeds of one run config, trained
resumably across sessions (the summary is :mod:`fp8jax.study.runs.validation`).

    m = Matrix(recipes=("bf16", "gemm:fp32_blockwise", "gemm:nvfp4_recipe"), seeds=(0, 1, 2))
    run_matrix(base_cfg, "out/validation", m, deadline=time.monotonic() + 540)

Each (recipe, seed) trains in ``<out>/runs/<recipe>_s<seed>`` with ``base_cfg`` (an
``ml_collections`` run config, :mod:`fp8jax.train.run_config`), its ``policy`` set to the
recipe and its init ``seed`` to the seed; the data order is the same for every run. A run
that finished has ``done.json`` and is skipped; one with checkpoints resumes. Runs go seed
by seed, so an interrupted matrix has whole seeds first. With a ``deadline``
(``time.monotonic()`` seconds) no run starts after it, and a running one is stopped at it as
by a preemption notice (it saves a checkpoint and the next call resumes it; runs without
checkpoints, ``train.checkpoints=False``, run to their end, and one stopped otherwise
starts again). Several processes may work on one matrix at once (e.g. on one GPU): each
run's folder is locked while it trains, and a process skips the runs another holds.
``group_seeds``: a recipe's seeds train together in one process, the step vmapped over
seeds (:mod:`fp8jax.train.seed_group`): one compilation per recipe instead of one per run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import contextlib
import dataclasses
import os
import pathlib
import re
import signal
import sys
import threading
import time

from fp8jax.data import folder_lock
from fp8jax.models import registry, rules_policy
from fp8jax.study.common import results_io
from fp8jax.train import preemption, run_config

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
    deepseek = registry.get("deepseek_moe:tiny")  # its grammar, whatever the depth
    for r in self.recipes:  # an unknown recipe fails here, before any run
      try:
        deepseek.parse_policy(r)
      except ValueError as e:  # DeepSeek-MoE's grammar, else rules over module paths
        try:
          rules_policy.parse(r, 1, "{i}")
        except ValueError:
          raise e from None

  def order(self) -> list[str]:
    """The recipes, the reference first."""
    return [REFERENCE] + [r for r in self.recipes if r != REFERENCE]

  def runs(self) -> list[tuple[str, int]]:
    """(recipe, seed) in the order they train: seed by seed, the reference first."""
    return [(r, s) for s in self.seeds for r in self.order()]


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
               train_fn: Callable | None = None, group_seeds: bool = False
               ) -> dict[str, list[str]]:
  """Trains every run of ``matrix`` not finished yet; returns the run names by outcome
  (``done``: finished now or before, ``stopped``: saved at the deadline, ``pending``: not
  started, ``busy``: held by another process). ``train_fn``:
  :func:`fp8jax.train.loop.train` (replaceable in tests). ``group_seeds``: recipe by
  recipe, the unfinished seeds that no other process holds train as one group, the step
  vmapped over seeds (:func:`fp8jax.train.seed_group.train_seeds`, or ``train_fn`` with its
  signature; runs without checkpoints only)."""
  if group_seeds:
    from fp8jax.train import seed_group  # pylint: disable=import-outside-toplevel
    seed_group.check(base_cfg)
    train_fn = train_fn or seed_group.train_seeds
  if train_fn is None:
    from fp8jax.train import loop  # pylint: disable=import-outside-toplevel
    train_fn = loop.train
  model = run_config.model(base_cfg)
  for recipe in matrix.recipes:  # as the run config's model reads it, before any run
    model.policy(recipe)
  stream = stream or sys.stderr
  out = pathlib.Path(out)
  outcome = {"done": [], "stopped": [], "pending": [], "busy": []}
  main = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, _ignore_term) if deadline and main else None
  try:
    if group_seeds:
      for recipe in matrix.order():
        _group(base_cfg, out, matrix, recipe, deadline, stream, train_fn, outcome)
    else:
      for recipe, seed in matrix.runs():
        _one(base_cfg, out, matrix, recipe, seed, deadline, stream, train_fn, outcome)
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
  return outcome


def _take(out, recipe, seed, deadline, stream, outcome, stack) -> pathlib.Path | None:
  """The run's folder, locked in ``stack`` until it closes, when the run is to train here;
  None when it is finished (``done``), too late to start (``pending``) or held by another
  process (``busy``), with its outcome recorded."""
  name = run_name(recipe, seed)
  workdir = out / "runs" / name
  if (workdir / DONE).exists():
    outcome["done"].append(name)
    return None
  if deadline is not None and time.monotonic() >= deadline:
    outcome["pending"].append(name)
    return None
  try:
    stack.enter_context(folder_lock.hold(workdir))
  except folder_lock.FolderLockedError:
    print(f"[validate] {name}: another process trains it, skipped", file=stream, flush=True)
    outcome["busy"].append(name)
    return None
  if (workdir / DONE).exists():  # finished by another process since the check above
    outcome["done"].append(name)
    return None
  return workdir


def _one(base_cfg, out, matrix, recipe, seed, deadline, stream, train_fn, outcome) -> None:
  """Trains one run of the matrix unless done or held by another process (``busy``);
  records its outcome. The run's folder stays locked from the check to ``done.json``."""
  with contextlib.ExitStack() as stack:
    workdir = _take(out, recipe, seed, deadline, stream, outcome, stack)
    if workdir is not None:
      _train_one(base_cfg, workdir, matrix, recipe, seed, deadline, stream, train_fn,
                 outcome)


def _group(base_cfg, out, matrix, recipe, deadline, stream, train_fn, outcome) -> None:
  """Trains the unfinished seeds of ``recipe`` that no other process holds as one group;
  their folders stay locked until their ``done.json`` files are written."""
  todo = []
  with contextlib.ExitStack() as stack:
    for seed in matrix.seeds:
      workdir = _take(out, recipe, seed, deadline, stream, outcome, stack)
      if workdir is None:
        continue
      if _has_checkpoint(workdir):
        raise ValueError(f"{workdir} holds checkpoints of a run trained alone; a seed group "
                         "trains runs without checkpoints (resume it without "
                         "--group_seeds)")
      _set_aside(workdir, stream)
      todo.append(seed)
    if not todo:
      return
    cfg = base_cfg.copy_and_resolve_references()
    cfg.policy = recipe
    print(f"[validate] {recipe}: seeds {todo} as one group ({len(outcome['done'])} of "
          f"{len(matrix.runs())} done here)", file=stream, flush=True)
    summaries = train_fn(cfg, {s: out / "runs" / run_name(recipe, s) for s in todo},
                         stream=stream)
    for s in todo:
      results_io.write_json(out / "runs" / run_name(recipe, s) / DONE,
                            {"recipe": recipe, "seed": s, "group": todo,
                             "final_step": summaries[s].get("final_step")})
      outcome["done"].append(run_name(recipe, s))


def _has_checkpoint(workdir: pathlib.Path) -> bool:
  ckpts = workdir / "checkpoints"
  return ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir())


def _set_aside(workdir: pathlib.Path, stream) -> None:
  """A run stopped without a checkpoint restarts from step 0: its metrics are kept as
  ``metrics.jsonl.stopped-<n>``, out of the new run's way."""
  metrics = workdir / "metrics.jsonl"
  if not metrics.exists():
    return
  n = 0
  while (aside := workdir / f"metrics.jsonl.stopped-{n}").exists():
    n += 1
  metrics.rename(aside)
  print(f"[validate] {workdir.name}: stopped earlier without a checkpoint; starts again "
        f"(its metrics kept as {aside.name})", file=stream, flush=True)


def _train_one(base_cfg, workdir, matrix, recipe, seed, deadline, stream, train_fn,
               outcome) -> None:
  name = workdir.name
  cfg = base_cfg.copy_and_resolve_references()
  cfg.policy, cfg.seed = recipe, seed
  resume = _has_checkpoint(workdir)
  if not resume:
    _set_aside(workdir, stream)
  print(f"[validate] {name}: {'resuming' if resume else 'start'} "
        f"({len(outcome['done'])} of {len(matrix.runs())} done here)", file=stream, flush=True)
  cancel = _stop_at(deadline)
  try:
    summary = train_fn(cfg, workdir, resume=resume, stream=stream)
  except preemption.Preempted:
    outcome["stopped"].append(name)
    return
  finally:
    if cancel is not None:
      cancel.set()
  results_io.write_json(workdir / DONE, {"recipe": recipe, "seed": seed,
                                         "final_step": summary.get("final_step")})
  outcome["done"].append(name)


def parse_seeds(text: Sequence[str]) -> tuple[int, ...]:
  """``["0", "1", "2"]`` or ``["0-2"]`` -> (0, 1, 2)."""
  seeds = []
  for part in text:
    lo, _, hi = str(part).partition("-")
    seeds.extend(range(int(lo), int(hi or lo) + 1))
  return tuple(seeds)
