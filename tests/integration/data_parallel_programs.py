"""Run by tests/train/test_data_parallel.py in a fresh process with 4 simulated CPU devices:
the compiled programs of the train step and of the paired evaluation, on 1 and on 4
devices at the same per-device batch, as JSON (collectives and memory per device)."""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from fp8jax.kernels import placement  # noqa: E402
from fp8jax.models import config as mc  # noqa: E402
from fp8jax.models import deepseek_model  # noqa: E402
from fp8jax.models import deepseek_moe as dm  # noqa: E402
from fp8jax.models import policy as policy_lib  # noqa: E402
from fp8jax.study.comparison import paired  # noqa: E402
from fp8jax.train import data_parallel as dp  # noqa: E402
from fp8jax.train import mesh as mesh_lib  # noqa: E402
from fp8jax.train import optim  # noqa: E402
from fp8jax.train import step as step_lib  # noqa: E402

CFG = mc.tiny()
MODEL = deepseek_model.model(CFG)
PER_DEVICE, SEQ = 2, 32
POLICY = "attn@0-2:e4m3"


def describe(lowered):
  compiled = lowered.compile()
  return {"collectives": dp.collectives(compiled),
          "temp_bytes": compiled.memory_analysis().temp_size_in_bytes}


def programs(n: int) -> dict:
  """{name: describe(...)} of the BF16 train step and the evaluator's functions (its
  baseline, a per-tensor E4M3 policy) on n devices."""
  mesh = mesh_lib.data_mesh(jax.devices()[:n])
  tx = optim.optimizer(optim.OptimConfig(peak_lr=1e-3, warmup_steps=1, total_steps=10))
  step = mesh_lib.shard_step(step_lib.make_train_step(MODEL, tx, mesh=mesh), mesh)
  params = jax.eval_shape(lambda: dm.init(CFG, jax.random.key(0)))
  state = jax.eval_shape(lambda p: step_lib.init_state(p, tx), params)
  tokens = jax.ShapeDtypeStruct((PER_DEVICE * n, SEQ), jnp.int32)
  out = {"train": describe(step.lower(state, tokens))}
  ev = paired.PairedEvaluator(MODEL, [policy_lib.parse_policy(POLICY)], mesh)
  rep = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                    sharding=mesh_lib.replicated(mesh)), params)
  batch = jax.ShapeDtypeStruct(tokens.shape, tokens.dtype,
                               sharding=mesh_lib.batch_sharding(mesh))
  for label, lower in ev.lowerings(rep, batch, list(ev.policies)).items():
    out[label] = describe(lower())
  return out


def partitioned() -> dict:
  """The collectives XLA puts in two small programs it partitions over the 4 devices: a
  sum over the batch (an all-reduce) and the batch gathered whole (an all-gather)."""
  mesh = mesh_lib.data_mesh()
  rows = jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=mesh_lib.batch_sharding(mesh))
  total = jax.jit(jnp.sum, out_shardings=mesh_lib.replicated(mesh))
  gather = jax.jit(lambda x: x * 2, out_shardings=mesh_lib.replicated(mesh))
  return {"sum": describe(total.lower(rows)), "gather": describe(gather.lower(rows))}


def kernels_allowed() -> dict:
  """Whether a GPU would take the Pallas kernels: inside the replicas' shard_map on 4
  devices (each its own program), and in the one program XLA partitions over them."""
  mesh, seen = mesh_lib.data_mesh(), {}

  def body(x):
    seen["per_device"] = placement.kernels_allowed("gpu")
    return dp.mean(x.sum())

  jax.jit(dp.per_device(body, mesh, (dp.ROWS,), dp.SAME)).lower(jnp.ones((4, 2)))
  with jax.set_mesh(mesh):
    seen["partitioned"] = placement.kernels_allowed("gpu")
  return seen


if __name__ == "__main__":
  assert len(jax.devices()) == 4, jax.devices()
  json.dump({"one": programs(1), "four": programs(4), "partitioned": partitioned(),
             "kernels_allowed": kernels_allowed()}, sys.stdout)
