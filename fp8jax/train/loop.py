"""The training run: validate, build, restore or start, step, log, checkpoint.

    summary = train(config, workdir, resume=False)

``workdir`` receives ``config.json``, ``run.json`` (the run's identity, recorded by every
checkpoint: :mod:`fp8jax.train.run_identity`), ``metrics.jsonl``,
``checkpoints/<step>/`` (step 0, every ``train.save_every`` steps and the last step; with
``train.full_state="last"`` only the newest keeps the optimizer state:
:mod:`fp8jax.train.full_state`) and, if asked, ``tensorboard/``.
Everything that can be checked before compute is checked first (see
:mod:`fp8jax.train.run_config`). A workdir that already holds checkpoints is only
continued with ``resume=True``, which restores the latest checkpoint (params, optimizer
state, data position), verified against the digests recorded at save, and continues
exactly where it stopped; a newest checkpoint that is torn or corrupt is set aside and the
run resumes from the one before (:func:`_restore_latest`); what a workdir may take is checked by
:mod:`fp8jax.train.workdir_checks`.

A resume may change only what alters neither a step's computation nor the data already
read (:data:`fp8jax.train.run_config.RESUME_MAY_CHANGE`, ``train.steps`` upwards with
``optim.total_steps`` set; docs/reliability.md: What may change on resume); it prints each
change. With
document shards, the rows carry ``skipped_records``: bad records skipped so far
(``data.skip_bad_records``), over all processes and restores.

A step whose loss, gradients or update are not finite stops the run with
:class:`NonFiniteError` naming the step and the first non-finite parameter, gradient or
updated parameter (``step.first_nonfinite``); that step changed
nothing and the checkpoints already written stay. An update that is itself non-finite
from finite inputs (``precision.check_update=False``, the default: ``fp8jax.train.step``)
stops the run at the next step, or before a checkpoint of it is saved; no non-finite state
is saved. With dynamic loss scaling
(``precision.loss_scale="dynamic"``, :mod:`fp8jax.train.loss_scale`) such a step is
skipped instead and the run goes on; the rows and the progress line then carry
``loss_scale`` and ``skipped_steps`` (cumulative), and the run stops only when the scale
would fall below ``precision.loss_scale_min``. ``train.steps`` counts steps, skipped ones
included; the LR schedule (and the ``lr`` column) follows the updates applied. A
preemption notice (SIGTERM) saves a checkpoint at the next step boundary and raises
:class:`~fp8jax.train.preemption.Preempted` (:mod:`fp8jax.train.preemption`); a run
without checkpoints (``train.checkpoints=False``) then just ends (default SIGTERM).

Every checkpoint's meta records the precision policy (``fp8jax.models.policy.record``)
and its policy record (``model.policy_record``: :mod:`fp8jax.models.policy_record`).
A resume under another policy than the latest checkpoint records (or, for checkpoints
older than the records, than ``config.json`` names) fails before any compute with
:class:`PolicyMismatchError` naming both, unless ``allow_policy_change=True``
(``--allow_policy_change``): then it warns and continues under the new policy.

:func:`build_step`, :func:`optimizer_for` and :func:`state_layout` build the step, the
optimizer and the state as :func:`train` does, for other code (branch, verify) to reuse.

Several processes (``jax.distributed``) run the same loop, each on its share of every
batch (:mod:`fp8jax.train.multihost`); process 0 alone writes the files and prints, and
holds the workdir's lock (:mod:`fp8jax.data.folder_lock`): a second ``train`` on it fails
at once naming the holder. ``train.noise_probe_every``: :mod:`fp8jax.train.noise_probe`;
``train.eval_precision`` (the loss of each logged batch in BF16 or the run's policy):
:mod:`fp8jax.train.evaluation`.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import sys
import time

import jax

from fp8jax.data import pipeline, tokenizers
from fp8jax.metrics import weights
from fp8jax.models import layer_stack
from fp8jax.train import checkpoint as ckpt_lib
from fp8jax.train import (
  determinism,
  evaluation,
  flops,
  metrics_log,
  multihost,
  noise_probe,
  optim,
  param_gather,
  preemption,
  run_config,
  run_identity,
  workdir_checks,
)
from fp8jax.train import mesh as mesh_lib
from fp8jax.train import step as step_lib
from fp8jax.train.checkpoint_digest import (
  CheckpointError,
  CorruptCheckpointError,
  ForeignCheckpointError,
)

PolicyMismatchError = ckpt_lib.PolicyMismatchError


class NonFiniteError(RuntimeError):
  """A training step produced a non-finite loss or gradient."""


def make_data(cfg, mesh, model_vocab: int):
  """The batch iterator of ``cfg.data`` for this process (checked before compute)."""
  d = cfg.data
  tok = tokenizers.get_tokenizer(d.tokenizer)
  pipeline.check_vocab(tok, model_vocab)
  mesh_lib.check_global_batch(d.global_batch, mesh)
  return pipeline.make_batches(
      d.source, tok, seq_len=d.seq_len, global_batch=d.global_batch, seed=d.seed,
      process_index=jax.process_index(), process_count=jax.process_count(),
      data_dir=d.data_dir or None, paths=tuple(d.paths), split=d.split, field=d.field,
      skip_bad_records=d.get("skip_bad_records", False))


def optimizer_for(cfg):
  """The optax transform of the run config ``cfg`` (schedule, clipping, AdamW with the
  ``precision.moments`` dtype)."""
  p = cfg.precision
  moments = None if (p.moments, p.master_weights) == ("float32", "float32") else p.moments
  return optim.optimizer(run_config.optim_config(cfg), moments_dtype=moments)


def build_step(cfg, model, tx, policy, mesh, sharding, with_routing: bool = False):
  """The sharded ``step(state, tokens) -> (state, metrics)`` of the run config ``cfg``'s
  ``model`` (:func:`fp8jax.train.run_config.model`) under ``policy``, every precision
  option applied as in :func:`train`; the state laid out as ``sharding``; ``with_routing``:
  ``metrics["routing"]`` (see ``step.make_train_step``)."""
  # FSDP: each device gathers a layer's weights where it runs and reduce-scatters its
  # gradient (data_parallel.gather_in_forward); the state stays split as ``sharding`` says.
  specs = (jax.tree.map(lambda s: s.spec, sharding.params) if cfg.train.fsdp else None)
  step = step_lib.make_train_step(
      model, tx, policy, loss_scale=run_config.loss_scale_config(cfg),
      fp8_param_gather=cfg.precision.fp8_param_gather, with_routing=with_routing,
      check_update=cfg.precision.check_update, mesh=mesh,
      replicas=cfg.train.replicas or None, param_specs=specs,
      gather_dtype=(cfg.train.get("fsdp_gather_dtype", "") or None) if specs else None)
  return mesh_lib.shard_step(step, mesh, sharding)


def state_layout(cfg, model, tx, mesh, policy=None):
  """(init function, abstract train state, its shardings) of a run of ``model``
  (:func:`fp8jax.train.run_config.model`): replicated, or split over the devices with
  ``train.fsdp``; with the amax histories of the policy's delayed-scaled sites, if any,
  params in ``precision.master_weights`` and the dynamic loss-scaling state, if on.
  ``policy``: the run's parsed policy (None: parse ``cfg.policy``)."""
  if policy is None:
    policy = model.policy(cfg.policy)
  init_seeded = step_lib.seeded_init(model, tx, policy, cfg.precision.master_weights,
                                     run_config.loss_scale_config(cfg),
                                     stacked=cfg.train.scan_layers)

  def init():
    return init_seeded(cfg.seed)

  abstract = jax.eval_shape(init)
  sharding = (mesh_lib.fsdp_sharding(abstract, mesh) if cfg.train.fsdp
              else jax.tree.map(lambda _: mesh_lib.replicated(mesh), abstract))
  return init, abstract, sharding


def restore_target(abstract, sharding):
  """ShapeDtypeStructs with shardings, for restoring a checkpoint into that layout."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, sharding)


def _restore_latest(ckpt, target, stream):
  """(step, state, data position) of the newest checkpoint. If it does not restore (a kill
  during the last save: ``<step>.incomplete``), fails verification (``<step>.corrupt``) or
  belongs to another run (``<step>.foreign``, :mod:`fp8jax.train.run_identity`)
  but the one before restores, the newest is renamed with that suffix (kept, out of the
  way) and the run resumes from the one before, saying so; else its error is raised."""
  steps = ckpt.all_steps()
  try:
    return (steps[-1], *ckpt.restore(steps[-1], target, "--resume")[:2])
  except CheckpointError as e:
    if len(steps) < 2:
      raise
    try:
      state, position, _ = ckpt.restore(steps[-2], target, "--resume")
    except (CheckpointError, ckpt_lib.ParamsOnlyCheckpointError):
      raise e from None
    path = ckpt.step_path(steps[-1])
    kind = ("corrupt" if isinstance(e, CorruptCheckpointError) else
            "foreign" if isinstance(e, ForeignCheckpointError) else "incomplete")
    print(f"warning: {e}; moved it to {path}.{kind}, resuming from the previous checkpoint, "
          f"step {steps[-2]}", file=stream or sys.stderr)
    if multihost.is_main():
      path.rename(path.with_name(f"{steps[-1]}.{kind}"))
    multihost.barrier("fp8jax_checkpoint_set_aside")
    ckpt.manager.reload()
    return steps[-2], state, position


def train(cfg, workdir, resume: bool = False, stream=None, devices=None,
          allow_policy_change: bool = False) -> dict:
  """Runs (or resumes) the training run ``cfg`` in ``workdir`` on ``devices`` (default
  all); returns a summary dict (``final_step``, ``final_loss``, ``workdir``: the
  checkpoints folder). ``allow_policy_change``: a resume may change ``cfg.policy``.
  ``cfg.train.deterministic``: the deterministic mode (:mod:`fp8jax.train.determinism`)."""
  determinism.set_mode(cfg.train.deterministic)  # its XLA flag, before any computation
  workdir = pathlib.Path(workdir)
  main, stream = multihost.is_main(), multihost.main_stream(stream or sys.stderr)
  model, policy = run_config.check(cfg)
  opt_cfg = run_config.optim_config(cfg)
  mesh = mesh_lib.data_mesh(devices)
  data = make_data(cfg, mesh, model.vocab_size)
  with multihost.lock_folder(workdir):  # one writer per workdir: a second run stops here
    has_run = workdir_checks.check(workdir, cfg, resume, policy, allow_policy_change, stream,
                                   record=model.record)
    if main:
      workdir.mkdir(parents=True, exist_ok=True)
      tmp = workdir / "config.json.tmp"  # the other processes may be reading config.json
      tmp.write_text(cfg.to_json(indent=2))
      tmp.replace(workdir / "config.json")

    if main and not (has_run and run_identity.read(workdir)):  # a new run, or one from
      # before identities (its checkpoints record it from now on)
      run_identity.create(workdir, cfg, getattr(data, "data", None))
    multihost.barrier("fp8jax_run_identity")
    tx = optimizer_for(cfg)
    init, abstract, sharding = state_layout(cfg, model, tx, mesh, policy)
    step_fn = build_step(cfg, model, tx, policy, mesh, sharding)
    if cfg.precision.fp8_param_gather:
      print(f"[train] {param_gather.describe(abstract.params)}", file=stream, flush=True)
    ckpt = (ckpt_lib.Checkpointer(workdir / "checkpoints", cfg.train.save_every,
                                  full_state=cfg.train.full_state,
                                  keep_full=cfg.train.full_state_steps,
                                  params_dtype=cfg.train.checkpoint_params_dtype)
            if cfg.train.checkpoints else ckpt_lib.NoCheckpointer(workdir / "checkpoints"))
    writer = (metrics_log.MetricsWriter(workdir, cfg.train.tensorboard) if main
              else metrics_log.NoWriter())
    config = json.loads(cfg.to_json())
    meta = {"config": config, "model": dict(model.meta), "policy": policy.name,
            ckpt_lib.POLICY: model.record(policy, cfg.policy),
            ckpt_lib.POLICY_RECORD: model.policy_record(policy),
            "eval_precision": evaluation.precision_of(config)}
    try:
      if has_run:
        start, state, position = _restore_latest(ckpt, restore_target(abstract, sharding),
                                                 stream)
        if start >= cfg.train.steps:
          return _finished(workdir, start, ckpt, stream)
        data.set_state(position)
        writer.truncate_after(start)
        print(f"[train] resuming from checkpoint {start}", file=stream, flush=True)
      else:
        start = 0
        state = jax.jit(init, out_shardings=sharding)()
        writer.truncate_after(0)  # rows of an earlier run here that saved no checkpoint
        ckpt.save(0, state, data.get_state(), meta, force=True)
      with (preemption.Watch(ckpt.manager) if cfg.train.checkpoints
            else contextlib.nullcontext()) as watch:  # None: no checkpoint to stop at
        return _run(cfg, model, policy, opt_cfg, state, start, step_fn, data, ckpt, writer, meta,
                    mesh, stream, watch)
    finally:
      ckpt.wait()
      ckpt.close()
      writer.close()


def _run(cfg, model, policy, opt_cfg, state, start, step_fn, data, ckpt, writer, meta, mesh,
         stream, watch) -> dict:
  total, log_every = cfg.train.steps, cfg.train.log_every
  lr_at = optim.schedule(opt_cfg)
  tokens_per_step = cfg.data.global_batch * cfg.data.seq_len
  peak = cfg.train.peak_tflops * 1e12 or flops.peak_flops(jax.devices()[0].device_kind)
  progress = metrics_log.Progress(total, start, stream)
  step_fn = metrics_log.FirstCalls("train", stream).wrap(evaluation.wrap(noise_probe.wrap(
      step_fn, cfg, model, policy, mesh, start), cfg, model, policy, mesh, start),
      "step", "the step")
  weight_norms = jax.jit(lambda p: weights.norms_by_module(layer_stack.unstack(p),
                                                           model.classifier))
  state_finite = jax.jit(step_lib.state_finite)
  batch = next(data) if start < total else None
  t_last, steps_since, loss, preempted = time.perf_counter(), 0, None, False
  for step in range(start, total):
    if preempted:  # saved (and logged if due) at the previous step
      ckpt.wait()
      raise preemption.Preempted(step, ckpt.directory)
    position = data.get_state()  # the data position after this step's batch
    state, m = step_fn(state, mesh_lib.global_batch(batch, mesh))
    batch = next(data) if step + 1 < total else None  # host work overlaps the device
    done, steps_since = step + 1, steps_since + 1
    if not bool(m["finite"]) and not bool(m.get("skipped", False)):
      _stop(done, m, ckpt, cfg)
    preempted = watch is not None and watch.reached(done) and done < total  # on every process
    force = done == total or preempted
    if cfg.train.checkpoints and (force or ckpt.manager.should_save(done)):
      _check_before_save(done, state_finite(state), ckpt, cfg)
    ckpt.save(done, state, position, meta, force=force)
    if done % log_every and done != total:
      continue
    now = time.perf_counter()
    tps = tokens_per_step * steps_since / (now - t_last)
    t_last, steps_since = now, 0
    scalars = jax.device_get({k: m[k] for k in ("loss", "lm_loss", "aux_loss", "grad_norm")})
    skipped = int(m["skipped_steps"]) if "skipped_steps" in m else 0
    row = {"step": done, **{k: float(v) for k, v in scalars.items()},
           "lr": float(lr_at(step - skipped)), "tokens_per_s": tps,  # at the updates applied
           "mfu": flops.mfu(tps, model, cfg.data.seq_len, peak, mesh.devices.size),
           **{f"weight_norm/{k}": float(v)
              for k, v in jax.device_get(weight_norms(state.params)).items()}}
    row.update({k: float(v) for k, v in jax.device_get(
        {k: v for k, v in m.items() if k.startswith(("probe/", evaluation.PREFIX))}).items()})
    if "loss_scale" in m:
      row["loss_scale"], row["skipped_steps"] = float(m["loss_scale"]), skipped
    if "skipped" in position:  # shards: bad records skipped so far, over all processes
      row["skipped_records"] = multihost.total(int(position["skipped"]))
    writer.write(row)
    progress.show(row)
    loss = row["loss"]
  return {"final_step": total, "final_loss": loss, "workdir": str(ckpt.directory),
          "checkpoints": bool(cfg.train.checkpoints)}


def _finished(workdir: pathlib.Path, step: int, ckpt, stream) -> dict:
  """The summary of a resumed run finished at ``step``, with the loss logged last."""
  path = workdir / "metrics.jsonl"
  rows = [r for r in metrics_log.read_rows(path) if r["step"] <= step] if path.exists() else []
  loss = rows[-1]["loss"] if rows else None
  said = f"last logged loss {loss:.6g} at step {rows[-1]['step']}" if rows else "no loss logged"
  print(f"[train] the run is already finished at step {step} ({said}); nothing to do",
        file=stream, flush=True)
  return {"final_step": step, "final_loss": loss, "workdir": str(ckpt.directory),
          "checkpoints": True, "already_finished": True}


def _last_good(ckpt, cfg) -> str:
  last = ckpt.latest_step()
  return (f"step {last} in {ckpt.directory}" if last is not None
          else "none (train.checkpoints=False)" if not cfg.train.checkpoints else "none")


def _check_before_save(done: int, groups, ckpt, cfg) -> None:
  """Raises :class:`NonFiniteError` if the state after step ``done`` (``groups``:
  ``step.state_finite``) is not finite: its update was (found before it is saved)."""
  where = step_lib.first_nonfinite(jax.device_get(groups))
  if where is None:
    return
  ckpt.wait()
  raise NonFiniteError(
      f"step {done}: its update made {where} non-finite from a finite loss and gradients "
      f"(an optimizer state or learning rate out of range; precision.check_update=True "
      f"refuses such a step before applying it); the run stopped without saving it; last "
      f"good checkpoint: {_last_good(ckpt, cfg)}")


def _stop(done: int, m, ckpt, cfg):
  """Raises :class:`NonFiniteError` for the non-finite step ``done`` (metrics ``m``)."""
  where = step_lib.first_nonfinite(jax.device_get(m["finite_groups"])) or "the loss"
  if where.startswith("params/") and not cfg.precision.check_update:
    where += (" (as this step read it: the update before made it non-finite, or it was "
              "restored so)")
  ckpt.wait()
  scaled = (f" with the loss scale at its minimum (precision.loss_scale_min "
            f"{cfg.precision.loss_scale_min:g})" if "skipped" in m else "")
  raise NonFiniteError(
      f"step {done}: non-finite loss, gradients or update{scaled} (first non-finite: {where}); the "
      f"run stopped without applying the step; last good checkpoint: {_last_good(ckpt, cfg)}")
