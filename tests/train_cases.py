"""Shared pieces of the training tests: a small run configuration and readers of a run's
folder (its metrics rows, its checkpoint steps)."""

from fp8jax.train import metrics_log, run_config


def small_config(steps=6, **precision):
  c = run_config.defaults()
  c.data.seq_len, c.data.global_batch = 32, 4
  c.optim.peak_lr, c.optim.warmup_steps, c.optim.total_steps = 3e-3, 2, 6
  c.train.steps, c.train.save_every, c.train.log_every = steps, 3, 1
  c.precision.update(precision)
  return c


def rows(workdir):
  return metrics_log.read_rows(workdir / "metrics.jsonl")


def ckpt_steps(workdir):
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
