"""Branch-off runs: from baseline checkpoints, K more training steps under BF16, a noise
floor and each precision policy, on identical batches.

    summary = run(train_workdir, out, policies=["sites"], from_steps=[0, 500],
                  branches=Branches(k=20))

From each chosen checkpoint of a training run, every branch restores the same train state
(params, optimizer state and so the schedule position) and trains ``k`` steps on the same
``k`` batches, those the run itself would have read next (its data position is restored
from the checkpoint). The branches are

- ``bf16``: the reference, BF16 (the policy the baseline is trained with);
- ``noise`` (``noise_1``, ...): BF16 from weights perturbed at BF16 rounding level
  (:func:`fp8jax.study.branches.branch_metrics.perturb`): the noise floor, the divergence that any
  perturbation of that size grows into. Precision matters only above it;
- one per policy (names and grids as in the comparison sweep).

All branches use the run's own training options (optimizer, moments, loss scaling, see
:func:`fp8jax.train.loop.build_step`). After each step every branch is compared with the
reference (:func:`fp8jax.study.branches.branch_metrics.compare_step`): loss gap on the step's batch,
parameter divergence (global, per module and per layer), update cosine and routing
divergence; ``growth_rate`` is the per-step log-slope of the divergence.

``<out>/branches.jsonl`` holds one line per (checkpoint, branch) with these series (see
:func:`_row`; ``null`` where a step was not finite, with ``nonfinite`` naming the step and
the first non-finite tensor; a non-finite step changes nothing, as in training);
``<out>/meta.json`` records the run, ``k``, the noise and the policies (each its ``expr``
and its policy record, :mod:`fp8jax.models.policy_record`; None for a model without).

The branches of a checkpoint are stepped together, one compiled step per policy (the BF16
one shared by the reference and noise branches), so the reference is computed once. When
they do not all fit in device memory they run in groups (``max_together``; by default from
the device's memory), each group with its own pass of the reference.

Kill-safe and resumable like the sweep: lines are whole-line appends, written when a
checkpoint's group finishes; a rerun skips the lines present and recomputes the rest from
the checkpoint, to the same numbers (every step is deterministic).

The reference branch continues in BF16; a checkpoint trained under another policy is
refused unless ``allow_policy_change`` (the policies it is branched into are the run's
explicit choice).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import sys
import time

import numpy as np

from fp8jax.study.branches import branch_engine, branch_memory, branch_metrics
from fp8jax.study.common import results_io
from fp8jax.study.comparison import sweep
from fp8jax.train import checkpoint as ckpt_lib
from fp8jax.train import determinism, metrics_log, multihost, run_config
from fp8jax.train import mesh as mesh_lib

REFERENCE = branch_engine.REFERENCE


@dataclasses.dataclass(frozen=True)
class Branches:
  """``k`` steps per branch; ``noise`` noise-floor branches whose weights are scaled by
  ``1 + noise_scale * U(-1, 1)`` (default: BF16's unit roundoff) with keys from
  ``noise_seed``."""
  k: int = 20
  noise: int = 1
  noise_scale: float = branch_metrics.BF16_UNIT_ROUNDOFF
  noise_seed: int = 0

  def __post_init__(self):
    if self.k < 1:
      raise ValueError(f"branch steps k must be >= 1, got {self.k}")
    if self.noise < 1:
      raise ValueError(f"at least one noise-floor branch is needed, got {self.noise}")
    if not 0 < self.noise_scale < 1:
      raise ValueError(f"noise_scale must be in (0, 1), got {self.noise_scale}")

  def noise_names(self) -> list[str]:
    return ["noise" if i == 0 else f"noise_{i}" for i in range(self.noise)]


def _reserved(branches: Branches) -> set[str]:
  return {REFERENCE, *branches.noise_names()}


def branch_policies(specs, num_layers, branches: Branches) -> list:
  """The policies of ``specs`` (as the sweep expands them for ``num_layers``, a depth or a
  :class:`fp8jax.models.api.Model`; none: only the reference and noise branches); one
  named like a built-in branch (``bf16``, ``noise``) gets the suffix ``_policy``."""
  out = []
  for p in sweep.expand_policies(specs, num_layers) if specs else []:
    if p.name in _reserved(branches):
      p = dataclasses.replace(p, name=f"{p.name}_policy")
    out.append(p)
  names = [p.name for p in out]
  if len(set(names)) != len(names):
    raise ValueError(f"policy names must be distinct, got {names}")
  return out


def trained_policy(meta: dict) -> tuple[str, bool]:
  """(expression, whether it is BF16: no site rule, no GEMM recipe) of the policy a
  checkpoint was trained with, from its meta: the policy record
  (:data:`fp8jax.train.checkpoint.POLICY`), or the policy name of checkpoints written
  before records existed (none: BF16)."""
  record = meta.get(ckpt_lib.POLICY)
  if isinstance(record, dict):
    return str(record.get("expression")), not record.get("rules") and record.get("gemm") is None
  name = str(meta.get("policy") or "bf16")
  return name, name == "bf16"


def check_trained_policies(ckpt, steps) -> None:
  """Raises ValueError naming the first of ``steps`` trained under a policy other than BF16
  (the reference branch continues in BF16)."""
  for step in steps:
    trained, is_bf16 = trained_policy(ckpt_lib.saved_meta(ckpt, step))
    if not is_bf16:
      raise ValueError(f"checkpoint {step} was trained under policy {trained!r}, but the "
                       "reference branch continues in 'bf16'; pass allow_policy_change "
                       "(--allow_policy_change) to branch from it anyway")


class _Output:
  """``<out>``: meta check and merge, done set, appends (no-ops unless ``write``)."""

  KEYS = ("train_workdir", "model", "k", "noise", "data")

  def __init__(self, out: pathlib.Path, meta: dict, write: bool):
    self.path, self.write, self.done = out / "branches.jsonl", write, set()
    if not write:
      return
    out.mkdir(parents=True, exist_ok=True)
    old = results_io.resumed_meta(out, meta, self.KEYS, "branch runs")
    if old is not None:
      meta["from_steps"] = sorted(set(old["from_steps"]) | set(meta["from_steps"]))
      meta["policies"] = {**old["policies"], **meta["policies"]}
    results_io.write_json(out / "meta.json", meta)
    self.done = {(r["from_step"], r["branch"]) for r in results_io.repair(self.path)}

  def append(self, row: dict) -> None:
    if self.write:
      results_io.append(self.path, row)


def run(train_workdir, out, policies=("sites",), from_steps=None,
        branches: Branches | None = None, devices=None, stream=None,
        allow_policy_change: bool = False, max_together: int | None = None,
        deterministic: bool | None = None, keep_restored: bool = True) -> dict:
  """Runs (or resumes) the branch-off runs; returns ``rows_written``, ``out``, ``together``
  (branches stepped at once besides the reference; None: all), ``groups`` and
  ``checkpoint_read_s`` (seconds spent restoring checkpoints from disk).

  Args:
    train_workdir: a training run's folder (:func:`fp8jax.train.loop.train`).
    out: the results folder.
    policies: grid names or policy expressions (as the comparison sweep takes them).
    from_steps: the checkpoints to branch from (default: all).
    branches: ``k``, the noise branches (:class:`Branches`).
    max_together: branches stepped together besides the reference (default: what fits,
      :func:`fp8jax.study.branches.branch_memory.auto_together`).
    keep_restored: when a checkpoint's branches run in several groups, keep its restored
      state in host memory for the later groups (if it fits) rather than reading the
      checkpoint again (:class:`~fp8jax.study.branches.branch_memory.RestoredState`).
    deterministic: every step in the deterministic mode (:mod:`fp8jax.train.determinism`);
      None: the training run's own mode. Recorded in ``meta.json``.

  Raises:
    ValueError: bad input (unknown checkpoint, policy, a results folder of another run, a
      checkpoint trained under a policy other than BF16 without ``allow_policy_change``),
      before any training step.
  """
  stream = multihost.main_stream(stream or sys.stderr)
  branches = branches or Branches()
  train_workdir, out = pathlib.Path(train_workdir), pathlib.Path(out)
  train_cfg = run_config.load_saved(train_workdir, "--train_workdir")
  if deterministic is not None:
    train_cfg.train.deterministic = bool(deterministic)
  mode = determinism.set_mode(train_cfg.train.deterministic)  # before any computation
  model, trained = run_config.check(train_cfg)  # the run's policy: its state layout
  pols = branch_policies(policies, model, branches)
  for p in pols:
    model.check(p)
  mesh = mesh_lib.data_mesh(devices)
  ckpt = ckpt_lib.Checkpointer(train_workdir / "checkpoints", save_every=1)
  available = ckpt.all_steps()
  steps = available if from_steps is None else sorted({int(s) for s in from_steps})
  missing = sorted(set(steps) - set(available))
  if missing or not steps:
    raise ValueError(f"checkpoints {missing or steps} are not in {train_workdir}; available: "
                     f"{available}")
  ckpt.check_full_state(steps, "branch")  # params-only checkpoints: before any compile
  if not allow_policy_change:
    check_trained_policies(ckpt, steps)
  entries = {p.name: model.policy_meta(p) for p in pols}
  expr = {name: entry["expr"] for name, entry in entries.items()}
  base = model.baseline
  all_branches = ([branch_engine.Branch(REFERENCE, "reference", base, "bf16")]
                  + [branch_engine.Branch(n, "noise", base, "bf16") for n in branches.noise_names()]
                  + [branch_engine.Branch(p.name, "policy", p, expr[p.name]) for p in pols])
  meta = {"train_workdir": str(train_workdir.resolve()),
          "model": dict(model.meta), "k": branches.k,
          "noise": {"branches": branches.noise, "scale": branches.noise_scale,
                    "seed": branches.noise_seed},
          "data": json.loads(json.dumps(sweep.data_config(train_cfg))),
          "policies": {name: {"expr": entry["expr"], "record": entry.get("record")}
                       for name, entry in entries.items()},
          "from_steps": steps, "code_version": ckpt_lib.code_version(), **mode}
  with multihost.lock_folder(out):  # one writer per results folder
    try:
      output, refused = _Output(out, meta, write=multihost.is_main()), None
    except ValueError as e:
      refused = e
    if multihost.any_process(refused is not None):
      raise refused or ValueError(f"process 0 refused the results folder {out} (its error)")
    todo_mask = multihost.broadcast(np.array(
        [[(s, b.name) not in output.done for b in all_branches] for s in steps], np.int32))
    todo = {s: [b for b, m in zip(all_branches, row) if m] for s, row in zip(steps, todo_mask)}
    todo = {s: bs for s, bs in todo.items() if bs}
    engine = branch_engine.Engine(train_cfg, model, mesh, all_branches, branches, trained)
    if todo:
      engine.fill_cache(stream)
    together = max_together or branch_memory.auto_together(
        engine.abstract, mesh, train_cfg.train.fsdp, engine.step_temp_bytes() if todo else None)
    first = metrics_log.FirstCalls("branch", stream, total=len(engine.steps))
    engine.steps = {k: first.wrap(f, k, f"the step of policy {k}") for k, f in engine.steps.items()}
    written, read_s = 0, 0.0
    try:
      groups = {s: _groups([b for b in bs if b.kind != "reference"], together)
                for s, bs in todo.items()}
      n_groups = sum(len(g) for g in groups.values())
      total = n_groups * branches.k
      if together and n_groups > len(groups):  # memory splits a checkpoint's branches
        print(f"[branch] {n_groups} groups of at most {together} branch(es), each beside its "
              "own pass of the reference (what fits in device memory)", file=stream)
      progress = metrics_log.Progress(total, 0, stream, prefix="branch")
      done = 0
      for s, group_list in groups.items():
        t0 = time.perf_counter()
        source, position = engine.restore(ckpt, s, len(group_list), keep_restored)
        read_s += time.perf_counter() - t0
        for group in group_list:
          tick = functools.partial(_tick, progress, done, s, len(group) + 1, branches.k)
          rows = engine.run_group(source, position, s, group, tick)
          done += branches.k
          for row in rows:
            if (s, row["branch"]) not in output.done:
              output.append(row)
              output.done.add((s, row["branch"]))
              written += 1
    finally:
      ckpt.close()
    return {"rows_written": written, "out": str(out), "together": together,
            "groups": n_groups,
            "checkpoint_read_s": read_s}


def _tick(progress, done: int, step: int, n: int, k: int, t: int) -> None:
  progress.message(done + t, f"checkpoint {step}: step {t}/{k}, {n} branches")


def _groups(bs: list, together: int | None) -> list[list]:
  """``bs`` in groups of at most ``together`` (None: one group); at least one group, so a
  checkpoint that misses only its reference line still runs."""
  if not bs:
    return [[]]
  size = together or len(bs)
  return [bs[i:i + size] for i in range(0, len(bs), size)]
