"""Training checkpoints: cadence, contents and exact restore."""

import jax
import numpy as np
import pytest

from fp8jax.models import config as mc
from fp8jax.models import deepseek_model
from fp8jax.models import deepseek_moe as dm
from fp8jax.train import checkpoint, optim
from fp8jax.train import step as step_lib


@pytest.mark.slow
def test_save_every_n_keep_all_and_restore_exactly(tmp_path):
  cfg = mc.tiny(dtype="float32")
  tx = optim.optimizer(optim.OptimConfig(peak_lr=1e-3, warmup_steps=1, total_steps=10))
  step = jax.jit(step_lib.make_train_step(deepseek_model.model(cfg), tx))
  state = step_lib.init_state(dm.init(cfg, jax.random.key(0)), tx)
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt", save_every=2)
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
  saved = {}
  for i in range(5):
    if ckpt.save(i, state, {"epoch": 0, "step": i, "seed": 0}, {"model": "tiny"}):
      saved[i] = jax.tree.map(np.asarray, state)
    state, _ = step(state, tokens)
  ckpt.wait()
  assert ckpt.all_steps() == [0, 2, 4] and ckpt.latest_step() == 4
  restored, data, meta = ckpt.restore(2, checkpoint.abstract_like(state))
  assert data == {"epoch": 0, "step": 2, "seed": 0}
  assert meta["model"] == "tiny" and meta["code_version"]
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(saved[2])):
    np.testing.assert_array_equal(a, b)
  assert isinstance(restored, step_lib.TrainState)
  ckpt.close()
  with pytest.raises(ValueError, match="save_every must be >= 1"):
    checkpoint.Checkpointer(tmp_path / "x", save_every=0)
