"""Run by tests/test_multidevice.py in a fresh process with 4 simulated CPU devices."""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

from fp8jax.models import config as mc  # noqa: E402
from fp8jax.models import deepseek_moe as dm  # noqa: E402
from fp8jax.train import mesh as mesh_lib  # noqa: E402
from fp8jax.train import optim  # noqa: E402
from fp8jax.train import step as step_lib  # noqa: E402


def losses(devices):
  cfg = mc.tiny(dtype="float32")
  tx = optim.optimizer(optim.OptimConfig(peak_lr=3e-3, warmup_steps=1, total_steps=20))
  mesh = mesh_lib.data_mesh(devices)
  step = mesh_lib.shard_step(step_lib.make_train_step(cfg, tx), mesh)
  state = jax.device_put(step_lib.init_state(dm.init(cfg, jax.random.key(0)), tx),
                         mesh_lib.replicated(mesh))
  out = []
  for i in range(3):
    tokens = jax.random.randint(jax.random.key(10 + i), (8, 16), 0, cfg.vocab_size)
    tokens = jax.device_put(tokens, mesh_lib.batch_sharding(mesh))
    state, m = step(state, tokens)
    out.append([float(m["loss"]), float(m["grad_norm"])])
  return out, len(state.params["norm"]["weight"].sharding.device_set)


if __name__ == "__main__":
  assert len(jax.devices()) == 4, jax.devices()
  one, _ = losses(jax.devices()[:1])
  four, n = losses(jax.devices())
  try:
    mesh_lib.check_global_batch(6, mesh_lib.data_mesh())
    error = None
  except ValueError as e:
    error = str(e)
  json.dump({"one": one, "four": four, "devices": n, "error": error}, sys.stdout)
