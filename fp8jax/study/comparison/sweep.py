"""The comparison sweep: checkpoints x evaluation batches x precision policies.

    summary = run(train_workdir, out, policies=["sites"], windows=Windows(...))
    summary = evaluate(model, checkpoint_source.InMemory({0: params}), batches, out, pols,
                       info={"model": ..., "windows": ..., "data": ...})

:func:`evaluate` sweeps a model over a checkpoint source
(:mod:`fp8jax.study.comparison.checkpoint_source`: a training run's folder or params in
memory); :func:`run` is that sweep over a training run's checkpoints, with the run's model
and data. For every checkpoint, the same evaluation batches (N batches at each of several
data offsets) are fed to the reference (the model's baseline policy, in the model's own
precision: BF16 for DeepSeek-MoE) once and to every policy; each (checkpoint, batch,
policy) gives one row of ``rows.jsonl`` plus one line of per-parameter details in
``details.jsonl``; ``baseline.jsonl`` holds the reference's losses and ``weights.jsonl``
the checkpoint's weight norms. ``meta.json`` records the sweep, and in ``reference`` the
precision the reference computes in, read from the model
(:meth:`fp8jax.models.api.Model.reference_precision`; the report names the reference by
it). The sweep resumes: finished work is skipped, and a killed run leaves no partial row
(rows are whole-line appends; the details line goes first and is dropped on resume if its
row never landed; a row whose details line is missing is recomputed). A torn last line is
repaired; a damaged line elsewhere stops the sweep with ValueError naming ``file:line``.
Non-finite FP8 results are kept as rows with ``finite: false`` and the name of the first
non-finite gradient, never averaged (the report lists them). A non-finite reference is a
data problem (a bad checkpoint or batch): its ``baseline.jsonl`` line says ``finite:
false`` and no FP8 row is written for that (checkpoint, batch).

A policy with delayed-scaled sites (``attn@0:e4m3/delayed(h=1024)``, the ``delayed`` grid)
is evaluated, at each (checkpoint, offset), with the amax histories left by
``delayed_warmup`` warm-up passes of that policy over the window's batches in turn
(:meth:`fp8jax.study.comparison.paired.PairedEvaluator.warm_state`); every batch of the window is
evaluated with the same histories, so a row does not depend on which rows came before and
the sweep resumes exactly. ``meta.json`` records the warm-up of each such policy.

Every checkpoint is verified as it is restored (:mod:`fp8jax.train.checkpoint_digest`): a corrupt
or incomplete one stops the sweep with its error, or with ``skip_corrupt=True`` is
skipped, reported in the summary and given no row.

In a multi-process run (:mod:`fp8jax.train.multihost`) every process computes, on its
share of each batch; process 0 alone reads and writes the results folder and prints
progress, and tells the others which results are missing.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import jax
import numpy as np

from fp8jax import metrics
from fp8jax.data import pipeline, tokenizers
from fp8jax.models import api
from fp8jax.study.common import noise_floor, results_io
from fp8jax.study.comparison import checkpoint_source, paired, sweep_rows
from fp8jax.study.comparison.eval_data import (  # noqa: F401  (also this module's API)
  Windows,
  check_data,
  data_config,
  eval_batches,
)
from fp8jax.study.comparison.policies import expand_policies, expression  # noqa: F401
from fp8jax.train import checkpoint as ckpt_lib
from fp8jax.train import (
  checkpoint_digest,
  data_parallel,
  determinism,
  metrics_log,
  multihost,
  parallel_compile,
  run_config,
)
from fp8jax.train import mesh as mesh_lib


def _key(row) -> tuple:
  return (row["step"], row["offset"], row["batch"], row.get("policy"))


class _Output:
  """The results folder: meta check, done sets, appends (all empty and no-ops unless
  ``write``: processes other than 0 leave the folder alone)."""

  def __init__(self, out: pathlib.Path, meta: dict, write: bool = True):
    self.dir, self.write = out, write
    self.rows, self.base, self.base_nonfinite, self.weights = set(), set(), set(), set()
    if not write:
      return
    out.mkdir(parents=True, exist_ok=True)
    keys = ("model", "windows", "train_workdir", "data", "replicas", "reference")
    old = results_io.resumed_meta(out, meta, keys, "a sweep", optional=keys[3:])
    if old is not None:
      for name in set(old["policies"]) & set(meta["policies"]):
        was, now = (m["policies"][name].get("delayed_warmup") for m in (old, meta))
        if was != now:
          raise ValueError(f"{out} holds policy {name!r} evaluated after {was} "
                           f"delayed-scaling warm-up steps, not {now}; use another "
                           "output folder")
      meta["steps"] = sorted(set(old["steps"]) | set(meta["steps"]))
      meta["policies"] = {**old["policies"], **meta["policies"]}
    results_io.write_json(out / "meta.json", meta)
    for name in ("rows", "details", "baseline", "weights"):  # a readable folder, even empty
      (out / f"{name}.jsonl").touch()
    # A row counts as done only with its details line: a row whose details line is
    # missing (or was torn) is dropped and recomputed, and details without a row go.
    detailed = {_key(d) for d in results_io.read(out / "details.jsonl")}
    rows = results_io.read(out / "rows.jsonl")
    redo = [r for r in rows if _key(r) not in detailed]
    if redo:
      print(f"warning: {out / 'rows.jsonl'}: {len(redo)} rows have no line in details.jsonl "
            f"(first: {_key(redo[0])}); recomputing them", file=sys.stderr)
    self.rows = {_key(r) for r in results_io.repair(out / "rows.jsonl",
                                                     lambda r: _key(r) in detailed)}
    results_io.repair(out / "details.jsonl", lambda r: _key(r) in self.rows)
    base = results_io.repair(out / "baseline.jsonl")
    self.base = {_key(r)[:3] for r in base}
    self.base_nonfinite = {_key(r)[:3] for r in base if not r.get("finite", True)}
    self.weights = {r["step"] for r in results_io.repair(out / "weights.jsonl")}

  def append(self, name: str, row: dict) -> None:
    if self.write:
      results_io.append(self.dir / name, row)


DELAYED_WARMUP = 4
"""Default warm-up passes of a delayed-scaling policy over an evaluation window."""


def run(train_workdir, out, policies=("sites",), steps=None, windows: Windows | None = None,
        devices=None, moe_impl: str = "dispatch", skip_corrupt: bool = False,
        stream=None, data: dict | None = None, allow_other_data: bool = False,
        delayed_warmup: int = DELAYED_WARMUP, floor: bool = True,
        floor_seed: int = 0, telemetry: bool = True, deterministic: bool = False,
        scan_layers: bool = False, replicas: int = 0) -> dict:
  """Runs (or resumes) the sweep over the checkpoints of the training run in
  ``train_workdir`` (:func:`evaluate` of its model on its data); returns ``rows_written``,
  ``out`` and ``skipped`` (``{step: error}`` of the checkpoints skipped as corrupt or
  incomplete).

  ``policies``: policy names, grids or expressions (:func:`expand_policies`). ``moe_impl``,
  ``deterministic`` (every pass in the deterministic mode, :mod:`fp8jax.train.determinism`;
  recorded in ``meta.json``) and ``scan_layers`` (alike consecutive layers as one
  ``lax.scan``: less to trace and compile): how the run's model computes
  (:func:`fp8jax.train.run_config.model`). The other arguments: as for :func:`evaluate`.

  The evaluation batches (``windows``) come from the training run's data, or from ``data``
  (settings over it, e.g. ``{"source": "prepared", "data_dir": ...}``). Their data id
  (:func:`fp8jax.data.pipeline.data_id`) must be the one the checkpoints recorded, unless
  ``allow_other_data``; ``meta.json`` records it.

  Raises:
    ValueError: the evaluation data differs from the training data (see above), or as
      :func:`evaluate` says.
    fp8jax.train.checkpoint_digest.CheckpointError: as :func:`evaluate` says.
  """
  mode = determinism.set_mode(deterministic)  # its XLA flag, before any computation
  stream = multihost.main_stream(stream or sys.stderr)
  windows = windows or Windows()
  train_cfg = run_config.load_saved(pathlib.Path(train_workdir), "--train_workdir")
  model = run_config.model(train_cfg, moe_impl=moe_impl, deterministic=deterministic,
                           scan=scan_layers)
  pols = expand_policies(policies, model)
  _check(devices, windows.batch_size, replicas, delayed_warmup)  # before reading any data
  source = checkpoint_source.RunFolder(train_workdir)
  try:
    steps = _steps(source, steps)
    d = data_config(train_cfg, data)
    data_id = pipeline.describe(d["source"], tokenizers.get_tokenizer(d["tokenizer"]),
                                d["paths"], d["data_dir"], windows.split or d["split"],
                                d["field"])
    check_data(source.checkpointer, steps, data_id, allow_other_data)
    batches = eval_batches(train_cfg, windows, data, stream)
    info = {"model": dict(model.meta), "windows": dataclasses.asdict(windows),
            "data": data_id, "code_version": ckpt_lib.code_version(), **mode}
    return evaluate(model, source, batches, out, pols, info=info, steps=steps,
                    devices=devices, skip_corrupt=skip_corrupt, stream=stream,
                    delayed_warmup=delayed_warmup, floor=floor, floor_seed=floor_seed,
                    telemetry=telemetry, replicas=replicas)
  finally:
    source.close()


def _check(devices, batch_size: int, replicas: int, delayed_warmup: int):
  """(the data mesh of ``devices``, its replicas), checked against the global
  ``batch_size`` (rows), with ``delayed_warmup``."""
  if delayed_warmup < 0:
    raise ValueError(f"delayed_warmup must be >= 0, got {delayed_warmup}")
  mesh = mesh_lib.data_mesh(devices)
  mesh_lib.check_global_batch(batch_size, mesh)
  return mesh, data_parallel.check_replicas(replicas, mesh, batch_size)


def _steps(source: checkpoint_source.Checkpoints, steps) -> list[int]:
  """``steps`` (default: all of ``source``'s), checked to be in ``source``."""
  available = list(source.steps)
  steps = available if steps is None else sorted(set(int(s) for s in steps))
  missing = sorted(set(steps) - set(available))
  if missing or not steps:
    raise ValueError(f"checkpoints {missing or steps} are not in "
                     f"{source.workdir or 'the params given'}; available: {available}")
  return steps


def evaluate(model: api.Model, checkpoints: checkpoint_source.Checkpoints, batches, out,
             policies, *, info: dict, steps=None, devices=None, skip_corrupt: bool = False,
             stream=None, delayed_warmup: int = DELAYED_WARMUP, floor: bool = True,
             floor_seed: int = 0, telemetry: bool = True, replicas: int = 0) -> dict:
  """Runs (or resumes) the sweep of ``model`` (:class:`fp8jax.models.api.Model`) over the
  params of ``checkpoints`` (a run folder or params in memory,
  :mod:`fp8jax.study.comparison.checkpoint_source`); returns ``rows_written``, ``out`` and
  ``skipped`` (``{step: error}`` of the checkpoints skipped as corrupt or incomplete).

  Args:
    model: the model; its ``apply`` takes ``policies``.
    checkpoints: the params by step.
    batches: ``{(offset, index): batch}``, this process's rows of each evaluation batch (a
      pytree of arrays with the batch on axis 0, e.g. int32 tokens [B, S]), in the order
      the sweep visits them.
    out: the results folder.
    policies: the parsed policies (distinct names).
    info: ``meta.json``'s description of the model (``model``), the batches (``windows``)
      and the data (``data``), and any other fields it should hold.
    steps: the steps to evaluate (default: all of ``checkpoints``).
    devices: the data mesh's devices (default: all).
    skip_corrupt: skip a corrupt or incomplete checkpoint (reported in ``skipped``, no
      rows) instead of stopping.
    delayed_warmup: the warm-up passes over each evaluation window (the batches of one
      offset) that fill the amax histories of the delayed-scaling policies (0: empty
      histories, where delayed scaling takes each tensor's own amax).
    floor: also write the noise floor of every (checkpoint, batch) as rows of the reserved
      policy ``floor`` (:mod:`fp8jax.study.common.noise_floor`; perturbation keys from
      ``floor_seed`` and the batch's step, offset and index): one more reference gradient
      per (checkpoint, batch).
    telemetry: record the block-scale telemetry of the GEMM recipes' forward operands
      (``tel/*`` fields of their rows, per operand in the details;
      :mod:`fp8jax.gemm.operand_telemetry`).
    replicas: the data-parallel replicas, each on its own rows of a batch (0: one per
      device; :mod:`fp8jax.train.data_parallel`; recorded in ``meta.json``).

  Raises:
    ValueError: bad steps, batch size, replicas or ``delayed_warmup``, a policy the model
      refuses, or a results folder of another sweep.
    fp8jax.train.checkpoint_digest.CheckpointError: a checkpoint is corrupt or incomplete (unless
      ``skip_corrupt``); the rows of the checkpoints before it are kept.
  """
  stream = multihost.main_stream(stream or sys.stderr)
  out, pols = pathlib.Path(out), list(policies)
  if not batches:
    raise ValueError("batches: give at least one evaluation batch")
  rows = int(np.shape(jax.tree.leaves(next(iter(batches.values())))[0])[0])
  mesh, replicas = _check(devices, rows * jax.process_count(), replicas, delayed_warmup)
  steps = _steps(checkpoints, steps)
  meta = {"train_workdir": checkpoints.workdir, **info,
          "policies": {p.name: {**model.policy_meta(p),
                                **({"delayed_warmup": delayed_warmup}
                                   if model.delayed_init(p) else {})} for p in pols},
          "steps": steps, "replicas": replicas,
          "reference": model.reference_precision(next(iter(batches.values()))),
          "classes": model.classifier.to_table(metrics.flatten(model.abstract_params()))}
  if floor:
    meta["policies"][noise_floor.FLOOR] = {
        "expr": noise_floor.FLOOR, "direct": [], "kind": "floor",
        "scale": noise_floor.BF16_UNIT_ROUNDOFF, "seed": floor_seed}
  evaluator = paired.PairedEvaluator(model, pols, mesh, telemetry=telemetry,
                                     replicas=replicas)  # checks the policies
  names = [p.name for p in pols] + ([noise_floor.FLOOR] if floor else [])
  with multihost.lock_folder(out):  # one writer per results folder
    try:
      output, refused = _Output(out, meta, write=multihost.is_main()), None
    except ValueError as e:  # process 0 checks the folder: every process stops with it
      refused = e
    if multihost.any_process(refused is not None):
      raise refused or ValueError(f"process 0 refused the results folder {out} (its error)")
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=mesh_lib.replicated(mesh)),
        model.abstract_params())
    weight_norms = jax.jit(
        lambda p: metrics.weights.norms_by_module(p, evaluator.model.classifier))
    # Process 0's view of the missing rows, so that every process runs the same computations.
    cells = [(s, k) for s in steps for k in batches]
    missing = multihost.broadcast(np.array(
        [[(s, *k) not in output.base_nonfinite and (s, *k, n) not in output.rows
          for n in names] for s, k in cells], np.int32).reshape(len(cells), len(names)))
    todo = [(s, k) for (s, k), row in zip(cells, missing) if row.any()]
    todo_pols = {(s, k): [n for n, m in zip(names, row) if m]
                 for (s, k), row in zip(cells, missing)}
    progress = metrics_log.Progress(len(todo), 0, stream, prefix="compare")
    first = metrics_log.FirstCalls("compare", stream, total=1 + len(names) + sum(
        bool(evaluator.empty_state.get(n)) for n in names))  # baseline, policies, warm-ups
    written, skipped, warm = 0, {}, {}
    place = lambda batch: jax.tree.map(  # noqa: E731
        lambda x: mesh_lib.global_batch(x, mesh), batch)
    window = lambda offset: [place(batches[k]) for k in sorted(  # noqa: E731
        k for k in batches if k[0] == offset)]
    if todo:  # every function the sweep will call, compiled together (a warm cache: no-op)
      step0, key0 = todo[0]
      needed = [n for n in names if any(n in todo_pols[c] for c in todo)]
      parallel_compile.fill_cache(evaluator.lowerings(
          evaluator.store(abstract), place(batches[key0]), needed,
          noise_floor.floor_key(floor_seed, step0, *key0)), stream, "compare")
    for i, (step, key) in enumerate(todo):
      if step in skipped:
        continue
      if i == 0 or todo[i - 1][0] != step:
        try:
          params = checkpoints.load(step, abstract)
        except checkpoint_digest.CheckpointError as e:
          if not skip_corrupt:
            raise
          skipped[step] = str(e)
          print(f"warning: skipping checkpoint {step}, no rows: {e}", file=stream)
          continue
        norms = jax.device_get(weight_norms(params))  # on every process (FSDP: collective)
        params = evaluator.store(params)  # scan_layers: stacked per run, once
        if step not in output.weights:
          output.append("weights.jsonl", {"step": step, **{f"weight_norm/{k}": float(v)
                                                           for k, v in norms.items()}})
        warm = {}  # (offset, policy) -> amax histories after the warm-up at this checkpoint
      for n in todo_pols[(step, key)]:
        if n != noise_floor.FLOOR and evaluator.empty_state[n] and (key[0], n) not in warm:
          with first.timed(("warm", n), f"the warm-up of policy {n}"):
            warm[(key[0], n)] = jax.block_until_ready(evaluator.warm_state(
                n, params, window(key[0]), delayed_warmup))
      written += _evaluate(evaluator, output, todo_pols[(step, key)], step, key, params,
                           place(batches[key]),
                           {n: warm.get((key[0], n)) for n in todo_pols[(step, key)]},
                           floor_seed, first)
      done_here = todo_pols[(step, key)]
      n_pols = len(done_here) - (noise_floor.FLOOR in done_here)
      progress.message(i + 1, f"checkpoint {step}, offset {key[0]} batch {key[1]}: "
                       f"{n_pols} policies" + (" + floor" if n_pols < len(done_here) else ""))
    return {"rows_written": written, "out": str(out), "skipped": skipped}


def _evaluate(evaluator, output: _Output, names, step: int, key, params, tokens,
              delayed: dict, floor_seed: int, first: metrics_log.FirstCalls) -> int:
  """The baseline and the rows of the policies ``names`` (those missing; the floor
  included) of one (checkpoint, batch), with each policy's amax histories
  ``delayed[name]`` (None: none); returns the number of rows written (none when the BF16
  baseline is non-finite)."""
  ids = {"step": step, "offset": key[0], "batch": key[1]}
  with first.timed("baseline", "the BF16 baseline"):
    base = jax.block_until_ready(evaluator.baseline(params, tokens))
  if (step, *key) not in output.base:
    output.append("baseline.jsonl", {**ids, **sweep_rows.baseline_row(base, params)})
  if not bool(jax.device_get(base.finite)):
    return 0  # a data problem, listed from baseline.jsonl: no FP8 row compares against it
  routed = sweep_rows.expert_tokens(base.routing)
  written = 0
  for name in names:
    with first.timed(name, f"policy {name}"):
      if name == noise_floor.FLOOR:
        res = jax.device_get(evaluator.floor(params, tokens, base, noise_floor.floor_key(
            floor_seed, step, *key)))
      else:
        res = jax.device_get(evaluator.variant(name, params, tokens, base, delayed[name]))
    row, details = sweep_rows.result_rows(res, params, {**ids, "policy": name}, routed)
    output.append("details.jsonl", details)
    output.append("rows.jsonl", row)
    written += 1
  return written
