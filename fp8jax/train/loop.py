"""The training run: validate, build, restore or start, step, log, checkpoint.

    summary = train(config, workdir, resume=False)

``workdir`` receives ``config.json``, ``metrics.jsonl``, ``checkpoints/<step>/`` (step 0,
every ``train.save_every`` steps and the last step) and, if asked, ``tensorboard/``.
Everything that can be checked before compute is checked first (see
:mod:`fp8jax.train.run_config`). A workdir that already holds checkpoints is only
continued with ``resume=True``, which restores the latest checkpoint (params, optimizer
state, data position), verified against the digests recorded at save, and continues
exactly where it stopped; a newest checkpoint that is torn or corrupt is set aside and the
run resumes from the one before (:func:`_restore_latest`).

A step whose loss or gradients are not finite stops the run with :class:`NonFiniteError`
naming the step and the first non-finite parameter or gradient; that step changed
nothing and the checkpoints already written stay. A preemption notice (SIGTERM) saves a
checkpoint at the next step boundary and raises
:class:`~fp8jax.train.preemption.Preempted` (:mod:`fp8jax.train.preemption`).

Several processes (``jax.distributed``) run the same loop, each on its share of every
batch (:mod:`fp8jax.train.multihost`); only process 0 writes ``config.json`` and
``metrics.jsonl`` and prints progress, and Orbax writes each checkpoint once.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import time

import jax

from fp8jax.data import pipeline, tokenizers
from fp8jax.metrics import weights
from fp8jax.models import deepseek_moe, delayed_sites, integrity
from fp8jax.models import policy as policy_lib
from fp8jax.train import checkpoint as ckpt_lib
from fp8jax.train import flops, metrics_log, multihost, optim, preemption, run_config
from fp8jax.train import mesh as mesh_lib
from fp8jax.train import step as step_lib


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


def state_layout(cfg, model_cfg, tx, mesh):
  """(init function, abstract train state, its shardings) of a run: replicated, or
  split over the devices with ``train.fsdp``; with the amax histories of the policy's
  delayed-scaled sites, if any."""
  delayed = delayed_sites.init(model_cfg, policy_lib.parse_policy(cfg.policy))
  init = lambda: step_lib.init_state(  # noqa: E731
      deepseek_moe.init(model_cfg, jax.random.key(cfg.seed)), tx, delayed)
  abstract = jax.eval_shape(init)
  sharding = (mesh_lib.fsdp_sharding(abstract, mesh) if cfg.train.fsdp
              else jax.tree.map(lambda _: mesh_lib.replicated(mesh), abstract))
  return init, abstract, sharding


def restore_target(abstract, sharding):
  """ShapeDtypeStructs with shardings, for restoring a checkpoint into that layout."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, sharding)


def _config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
  """Dotted keys whose values differ between two config dicts."""
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      out.extend(_config_changes(a, b, f"{prefix}{key}."))
    elif a != b:
      out.append(prefix + key)
  return out


def _with_defaults(saved: dict, defaults: dict) -> dict:
  """``saved`` with the keys it lacks (added to the defaults after it was written) filled
  in from ``defaults``."""
  out = dict(saved)
  for key, value in defaults.items():
    if key not in out:
      out[key] = value
    elif isinstance(value, dict) and isinstance(out[key], dict):
      out[key] = _with_defaults(out[key], value)
  return out


def _check_workdir(workdir: pathlib.Path, cfg, resume: bool) -> bool:
  """Returns whether there is a run to resume; refuses to overwrite one."""
  saved = workdir / "config.json"
  ckpts = workdir / "checkpoints"
  has_run = ckpts.exists() and any(p.name.isdigit() for p in ckpts.iterdir())
  if has_run and not resume:
    raise FileExistsError(f"{workdir} already holds a training run; pass --resume to "
                          "continue it or choose a new workdir")
  if has_run and saved.exists():
    old, new = json.loads(saved.read_text()), json.loads(cfg.to_json())
    old = _with_defaults(old, json.loads(run_config.defaults().to_json()))  # keys added since
    # train.steps may grow, unless the LR schedule follows it (optim.total_steps = 0).
    allowed = {"train.steps"} if old["optim"]["total_steps"] else set()
    changed = [k for k in _config_changes(old, new) if k not in allowed]
    if changed:
      raise ValueError(f"--resume with a config that differs from {saved} in {changed}; "
                       "only train.steps may change, and only with optim.total_steps set")
  return has_run


def _restore_latest(ckpt, target, stream):
  """(step, state, data position) of the newest checkpoint. If it does not restore (a
  kill during the last save: ``<step>.incomplete``) or fails verification
  (``<step>.corrupt``) but the one before restores, the newest is renamed with that
  suffix (kept, out of the way) and the run resumes from the one before, saying so;
  otherwise the newest one's error is raised."""
  steps = ckpt.all_steps()
  try:
    return (steps[-1], *ckpt.restore(steps[-1], target)[:2])
  except integrity.CheckpointError as e:
    if len(steps) < 2:
      raise
    try:
      state, position, _ = ckpt.restore(steps[-2], target)
    except integrity.CheckpointError:
      raise e from None
    path = ckpt.step_path(steps[-1])
    kind = "corrupt" if isinstance(e, integrity.CorruptCheckpointError) else "incomplete"
    print(f"warning: {e}; moved it to {path}.{kind}, resuming from the previous checkpoint, "
          f"step {steps[-2]}", file=stream or sys.stderr)
    if multihost.is_main():
      path.rename(path.with_name(f"{steps[-1]}.{kind}"))
    multihost.barrier("fp8jax_checkpoint_set_aside")
    ckpt.manager.reload()
    return steps[-2], state, position


def train(cfg, workdir, resume: bool = False, stream=None, devices=None) -> dict:
  """Runs (or resumes) the training run ``cfg`` in ``workdir`` on ``devices`` (default
  all); returns a summary dict (``final_step``, ``final_loss``, ``workdir``)."""
  workdir = pathlib.Path(workdir)
  main, stream = multihost.is_main(), multihost.main_stream(stream or sys.stderr)
  model_cfg, policy = run_config.validate(cfg)
  opt_cfg = run_config.optim_config(cfg)
  mesh = mesh_lib.data_mesh(devices)
  data = make_data(cfg, mesh, model_cfg.vocab_size)
  has_run = _check_workdir(workdir, cfg, resume)
  if main:
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = workdir / "config.json.tmp"  # the other processes may be reading config.json
    tmp.write_text(cfg.to_json(indent=2))
    tmp.replace(workdir / "config.json")

  tx = optim.optimizer(opt_cfg)
  init, abstract, sharding = state_layout(cfg, model_cfg, tx, mesh)
  step_fn = mesh_lib.shard_step(
      step_lib.make_train_step(model_cfg, tx, policy, moe_impl=cfg.train.moe_impl,
                               moe_groups=mesh.devices.size), mesh, sharding)
  ckpt = ckpt_lib.Checkpointer(workdir / "checkpoints", cfg.train.save_every)
  writer = (metrics_log.MetricsWriter(workdir, cfg.train.tensorboard) if main
            else metrics_log.NoWriter())
  meta = {"config": json.loads(cfg.to_json()), "model": dataclasses.asdict(model_cfg),
          "policy": policy.name}
  try:
    if has_run:
      start, state, position = _restore_latest(ckpt, restore_target(abstract, sharding),
                                               stream)
      data.set_state(position)
      writer.truncate_after(start)
      print(f"[train] resuming from checkpoint {start}", file=stream, flush=True)
    else:
      start = 0
      state = jax.jit(init, out_shardings=sharding)()
      ckpt.save(0, state, data.get_state(), meta, force=True)
    with preemption.Watch(ckpt.manager) as watch:
      return _run(cfg, model_cfg, opt_cfg, state, start, step_fn, data, ckpt, writer, meta,
                  mesh, stream, watch)
  finally:
    ckpt.wait()
    ckpt.close()
    writer.close()


def _run(cfg, model_cfg, opt_cfg, state, start, step_fn, data, ckpt, writer, meta, mesh,
         stream, watch) -> dict:
  total, log_every = cfg.train.steps, cfg.train.log_every
  lr_at = optim.schedule(opt_cfg)
  tokens_per_step = cfg.data.global_batch * cfg.data.seq_len
  kind = jax.devices()[0].device_kind
  peak = cfg.train.peak_tflops * 1e12 or flops.peak_flops(kind)
  progress = metrics_log.Progress(total, start, stream)
  weight_norms = jax.jit(weights.norms_by_module)
  batch = next(data) if start < total else None
  t_last, steps_since, loss, preempted = time.perf_counter(), 0, None, False
  for step in range(start, total):
    if preempted:  # saved (and logged if due) at the previous step
      ckpt.wait()
      raise preemption.Preempted(step, ckpt.manager.directory)
    position = data.get_state()  # the data position after this step's batch
    state, m = step_fn(state, mesh_lib.global_batch(batch, mesh))
    batch = next(data) if step + 1 < total else None  # host work overlaps the device
    done, steps_since = step + 1, steps_since + 1
    if not bool(m["finite"]):
      where = step_lib.first_nonfinite(jax.device_get(m["finite_groups"])) or "the loss"
      ckpt.wait()
      raise NonFiniteError(
          f"step {done}: non-finite loss or gradients (first non-finite: {where}); the run "
          f"stopped without applying the step; last good checkpoint: step "
          f"{ckpt.latest_step()} in {ckpt.manager.directory}")
    preempted = watch.reached(done) and done < total  # the same step on every process
    ckpt.save(done, state, position, meta, force=done == total or preempted)
    if done % log_every and done != total:
      continue
    now = time.perf_counter()
    tps = tokens_per_step * steps_since / (now - t_last)
    t_last, steps_since = now, 0
    scalars = jax.device_get({k: m[k] for k in ("loss", "lm_loss", "aux_loss", "grad_norm")})
    row = {"step": done, **{k: float(v) for k, v in scalars.items()},
           "lr": float(lr_at(step)), "tokens_per_s": tps,
           "mfu": flops.mfu(tps, model_cfg, cfg.data.seq_len, peak, mesh.devices.size),
           **{f"weight_norm/{k}": float(v)
              for k, v in jax.device_get(weight_norms(state.params)).items()}}
    writer.write(row)
    progress.show(row)
    loss = row["loss"]
  return {"final_step": total, "final_loss": loss, "workdir": str(ckpt.manager.directory)}
