"""Several init seeds of one run config in one process: the training step vmapped over seeds.

The validation matrix (:mod:`fp8jax.study.runs.validation`) trains each recipe with several
init seeds and one data order. Separate processes each trace and compile the same step, and
their small steps share a GPU poorly. :func:`train_seeds` stacks the seeds' train states
along a leading axis and runs ``jax.vmap(step, in_axes=(0, None))`` on each batch: one
compilation, one data stream, one launch per step for all the seeds. Each seed's folder
gets what :func:`fp8jax.train.loop.train` writes for a run without checkpoints: its
``config.json`` (with its seed) and ``metrics.jsonl`` rows with the same keys
(``tokens_per_s`` is one run's throughput; ``mfu`` that of the whole group). Every seed sees
the same batches, as separate runs of the config do, and each seed's initial params are
bit-identical to its separate run's (``jax.random`` is the same under ``vmap``); later
values agree to the BF16 compute's rounding (a batched GEMM may sum in another order; on a
GPU, as a default-mode run agrees with its own rerun).

Limits: runs without checkpoints (``train.checkpoints=False``: a group stopped part-way
starts again), on one device of one process, without FSDP or loss scaling.
"""

from __future__ import annotations

from collections.abc import Mapping
import contextlib
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

from fp8jax.metrics import weights
from fp8jax.models import layer_stack
from fp8jax.train import (
  determinism,
  evaluation,
  flops,
  loop,
  metrics_log,
  multihost,
  noise_probe,
  optim,
  run_config,
)
from fp8jax.train import mesh as mesh_lib
from fp8jax.train import step as step_lib


def check(cfg):
  """``run_config.check(cfg)`` (model, policy); raises ValueError when ``cfg`` is not a
  valid run config or cannot be trained as a seed group (see the limits)."""
  validated = run_config.check(cfg)
  if cfg.train.checkpoints:
    raise ValueError("a seed group trains runs without checkpoints only "
                     "(train.checkpoints=False)")
  if cfg.precision.loss_scale != "none":
    raise ValueError("a seed group stops at a non-finite step: precision.loss_scale must be "
                     "'none'")
  if cfg.train.fsdp:
    raise ValueError("a seed group runs on one device: train.fsdp must be False")
  if jax.process_count() > 1:
    raise ValueError("a seed group runs in one process")
  return validated


def train_seeds(cfg, workdirs: Mapping[int, str | pathlib.Path], stream=None) -> dict:
  """Trains ``cfg`` once per init seed, ``workdirs`` ``{seed: run folder}``, vmapped over
  the seeds; returns ``{seed: {"final_step", "final_loss", "workdir"}}``.

  Raises:
    ValueError: ``cfg`` does not suit a seed group (:func:`check`), or no seeds.
    fp8jax.train.loop.NonFiniteError: a step of some seed was not finite (named).
  """
  model, policy = check(cfg)
  if not workdirs:
    raise ValueError("train_seeds: no seeds")
  determinism.set_mode(cfg.train.deterministic)
  stream = stream or sys.stderr
  seeds = sorted(int(s) for s in workdirs)
  dirs = {s: pathlib.Path(workdirs[s]) for s in seeds}
  mesh = mesh_lib.data_mesh(jax.devices()[:1])
  data = loop.make_data(cfg, mesh, model.vocab_size)
  tx = loop.optimizer_for(cfg)
  with contextlib.ExitStack() as stack:
    for s in seeds:
      stack.enter_context(multihost.lock_folder(dirs[s]))
    writers = {}
    for s in seeds:
      one = cfg.copy_and_resolve_references()
      one.seed = s
      (dirs[s] / "config.json").write_text(one.to_json(indent=2))
      writers[s] = stack.enter_context(contextlib.closing(metrics_log.MetricsWriter(dirs[s])))
      writers[s].truncate_after(0)
    init = step_lib.seeded_init(model, tx, policy, cfg.precision.master_weights,
                                run_config.loss_scale_config(cfg),
                                stacked=cfg.train.scan_layers)
    state = jax.jit(jax.vmap(init))(jnp.asarray(seeds))
    step = jax.jit(jax.vmap(step_lib.make_train_step(
        model, tx, policy, loss_scale=run_config.loss_scale_config(cfg),
        fp8_param_gather=cfg.precision.fp8_param_gather,
        check_update=cfg.precision.check_update), in_axes=(0, None)))
    every = int(cfg.train.noise_probe_every)
    if every and policy != model.baseline:
      probe = noise_probe.make_probe(model, policy)
      step = noise_probe.Probed(step, jax.vmap(probe, in_axes=(0, 0, None)), every, 0)
    evaluate = evaluation.evaluator(cfg, model, policy)  # train.eval_precision
    if evaluate is not None:
      step = evaluation.Evaluated(step, jax.jit(jax.vmap(evaluate, in_axes=(0, 0, None))), 0,
                                  cfg.train.steps, cfg.train.log_every)
    label = f"train seeds {','.join(map(str, seeds))}"
    step = metrics_log.FirstCalls(label, stream).wrap(step, "step", "the step")
    return _run(cfg, model, state, step, data, mesh, seeds, writers, dirs,
                metrics_log.Progress(cfg.train.steps, 0, stream, label))


def _run(cfg, model, state, step_fn, data, mesh, seeds, writers, dirs, progress) -> dict:
  total, log_every = cfg.train.steps, cfg.train.log_every
  lr_at = optim.schedule(run_config.optim_config(cfg))
  tokens_per_step = cfg.data.global_batch * cfg.data.seq_len
  peak = cfg.train.peak_tflops * 1e12 or flops.peak_flops(jax.devices()[0].device_kind)
  norms = jax.jit(jax.vmap(lambda p: weights.norms_by_module(layer_stack.unstack(p),
                                                            model.classifier)))
  batch = next(data)
  t_last, since, rows = time.perf_counter(), 0, {}
  for i in range(total):
    state, m = step_fn(state, mesh_lib.global_batch(batch, mesh))
    batch = next(data) if i + 1 < total else None
    done, since = i + 1, since + 1
    finite = jax.device_get(m["finite"])
    if not finite.all():
      _stop(done, m, seeds, finite)
    if done % log_every and done != total:
      continue
    now = time.perf_counter()
    tps = tokens_per_step * since / (now - t_last)
    t_last, since = now, 0
    keys = ("loss", "lm_loss", "aux_loss", "grad_norm")
    extra = ("probe/", evaluation.PREFIX)
    got = jax.device_get({**{k: m[k] for k in keys}, "norms": norms(state.params),
                          **{k: v for k, v in m.items() if k.startswith(extra)}})
    common = {"lr": float(lr_at(i)), "tokens_per_s": tps,
              "mfu": flops.mfu(tps * len(seeds), model, cfg.data.seq_len, peak, 1)}
    for j, s in enumerate(seeds):
      row = {"step": done, **{k: float(got[k][j]) for k in keys}, **common,
             **{f"weight_norm/{k}": float(v[j]) for k, v in got["norms"].items()},
             **{k: float(v[j]) for k, v in got.items() if k.startswith(extra)}}
      writers[s].write(row)
      rows[s] = row
    progress.show(rows[seeds[0]])
  return {s: {"final_step": total, "final_loss": rows[s]["loss"], "workdir": str(dirs[s])}
          for s in seeds}


def _stop(done: int, m, seeds, finite) -> None:
  bad = [s for s, ok in zip(seeds, finite) if not ok]
  j = seeds.index(bad[0])
  groups = jax.tree.map(lambda x: x[j], jax.device_get(m["finite_groups"]))
  where = step_lib.first_nonfinite(groups) or "the loss"
  raise loop.NonFiniteError(
      f"step {done}: non-finite loss, gradients or update for seeds {bad} (seed {bad[0]}: first "
      f"non-finite {where}); the group stopped without checkpoints (train.checkpoints="
      "False)")
