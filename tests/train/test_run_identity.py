"""A checkpoint copied in from another run is recognised (``fp8jax/train/run_identity.py``):
every checkpoint records its run's identity, and a restore, ``verify`` or a resume of one
whose identity is not its workdir's finds it foreign; runs from before identities load."""

import json
import shutil

import jax.numpy as jnp
import pytest

from fp8jax.train import checkpoint, checkpoint_digest, loop, metrics_log, run_config, run_identity


def _state():
  return {"params": {"w": jnp.arange(6.0).reshape(2, 3)}}


def test_a_checkpoint_of_another_run_is_foreign(tmp_path):
  cfg = run_config.defaults()
  mine = run_identity.create(tmp_path, cfg)
  assert run_identity.read(tmp_path) == mine and len(mine["id"]) == 32
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", save_every=1)
  ckpt.save(0, _state(), {"step": 0}, {})
  ckpt.wait()
  assert checkpoint.saved_meta(ckpt, 0)[checkpoint.RUN]["id"] == mine["id"]
  target = checkpoint.abstract_like(_state())
  assert isinstance(ckpt.verify(0, target), checkpoint_digest.Ok)
  cfg.seed = 1
  other = run_identity.create(tmp_path, cfg)  # as if the checkpoint came from elsewhere
  status = ckpt.verify(0, target)
  assert isinstance(status, checkpoint_digest.Foreign)
  line = checkpoint_digest.describe(status)
  assert mine["id"][:8] in line and other["id"][:8] in line and "seed 1" in line
  with pytest.raises(checkpoint_digest.ForeignCheckpointError, match="from another run"):
    ckpt.restore(0, target)
  ckpt.close()


def test_runs_without_an_identity_are_not_checked(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", save_every=1)
  ckpt.save(0, _state(), {"step": 0}, {})  # no run.json: an earlier version's run
  ckpt.wait()
  assert checkpoint.RUN not in checkpoint.saved_meta(ckpt, 0)
  run_identity.create(tmp_path, run_config.defaults())
  assert isinstance(ckpt.verify(0, checkpoint.abstract_like(_state())), checkpoint_digest.Ok)
  ckpt.close()
  (tmp_path / run_identity.FILE).write_text("{not json")
  assert run_identity.read(tmp_path) is None


@pytest.mark.slow
def test_a_resume_sets_a_foreign_newest_checkpoint_aside(train_run, tmp_path):
  """The issue's case: another run's checkpoint placed as the newest of this workdir; the
  resume keeps it (renamed ``<step>.foreign``) and continues this run from its own."""
  identity = run_identity.read(train_run)  # names the data, as each checkpoint's position
  position = json.loads((train_run / "checkpoints" / "4" / "data" / "metadata").read_text())
  assert identity["data"] and identity["data"] == position["data"]
  c = run_config.load_saved(train_run)
  c.seed, c.train.steps, c.optim.total_steps = c.seed + 1, 2, 4
  work = tmp_path / "mine"
  loop.train(c, work)
  shutil.copytree(train_run / "checkpoints" / "4", work / "checkpoints" / "4")
  c.train.steps = 4
  log = tmp_path / "log.txt"
  with log.open("w") as stream:
    loop.train(c, work, resume=True, stream=stream)
  text = log.read_text()
  assert "from another run" in text and "resuming from checkpoint 2" in text, text
  assert (work / "checkpoints" / "4.foreign").is_dir()
  rows = metrics_log.read_rows(work / "metrics.jsonl")
  assert [r["step"] for r in rows] == [2, 4]
  mine = json.loads((work / run_identity.FILE).read_text())["id"]
  assert checkpoint.saved_meta(work / "checkpoints", 4)[checkpoint.RUN]["id"] == mine

