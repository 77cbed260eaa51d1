"""Verify every checkpoint of a training run folder: one status per checkpoint.

    for step, status in verify_run("out/train"):
      print(step, checkpoint_digest.describe(status))

Each checkpoint is restored as ``--resume`` restores it (params, optimizer state and data
position, in the run's layout) and its arrays and data positions are compared with the
digests recorded at save (:mod:`fp8jax.train.checkpoint_digest`,
:func:`fp8jax.train.data_positions.check`): :class:`~fp8jax.train.checkpoint_digest.Ok`,
:class:`~fp8jax.train.checkpoint_digest.Corrupt` (the first array, or positions file, that differs),
:class:`~fp8jax.train.checkpoint_digest.Incomplete` (does not restore) or
:class:`~fp8jax.train.checkpoint_digest.NoDigests` (written before digests existed).
"""

from __future__ import annotations

import pathlib

from fp8jax.train import checkpoint as ckpt_lib
from fp8jax.train import checkpoint_digest, loop, optim, run_config
from fp8jax.train import mesh as mesh_lib


def verify_run(workdir, devices=None) -> list[tuple[int, checkpoint_digest.Status]]:
  """``[(step, status)]`` of every checkpoint of the run in ``workdir``, ascending.

  Raises:
    FileNotFoundError: ``workdir`` is not a training run's folder.
  """
  workdir = pathlib.Path(workdir)
  cfg = run_config.load_saved(workdir)
  tx = optim.optimizer(run_config.optim_config(cfg))
  _, abstract, sharding = loop.state_layout(cfg, run_config.model(cfg), tx,
                                            mesh_lib.data_mesh(devices))
  target = loop.restore_target(abstract, sharding)
  ckpt = ckpt_lib.Checkpointer(workdir / "checkpoints", save_every=1)
  try:
    return [(step, ckpt.verify(step, target)) for step in ckpt.all_steps()]
  finally:
    ckpt.close()


def is_usable(status: checkpoint_digest.Status) -> bool:
  """Whether a reader may use the checkpoint (ok, or unverifiable for lack of digests)."""
  return isinstance(status, checkpoint_digest.Ok | checkpoint_digest.NoDigests)
