"""Data-parallel replicas (fp8jax.train.data_parallel): the programs on 4 simulated CPU
devices hold no collective but all-reduces and need no more memory per device than the
one-device program at the same per-device batch; replicas on one device (vmapped) reduce
like replicas on several."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.models import policy as policy_lib
from fp8jax.train import data_parallel as dp
from fp8jax.train import mesh as mesh_lib

REPO = pathlib.Path(__file__).resolve().parents[2]


def _programs() -> dict:
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable,
                        str(REPO / "tests" / "integration" / "data_parallel_programs.py")],
                       capture_output=True, text=True, env=env, check=True, timeout=900)
  return json.loads(out.stdout)


@pytest.mark.slow
def test_four_device_programs():
  """One subprocess, four checks: (1) the 4-device programs of the train step and the
  paired evaluation hold no collective but all-reduces (the gradients, the histories);
  (2) each needs at most the memory of the one-device program at the same per-device
  batch; (3) a GPU takes the Pallas kernels in each replica's program (without them the
  blockwise GEMM recipe's XLA fallback needed 10x the memory on 2 GPUs), never in a
  program that XLA partitions; (4) the check sees the collectives XLA puts in programs it
  partitions."""
  programs = _programs()
  four = programs["four"]
  assert set(four) == set(programs["one"])
  assert "train" in four and "the BF16 baseline" in four and len(four) >= 3
  for name, program in four.items():
    kinds = set(program["collectives"])
    assert kinds == {"all-reduce"}, (name, program["collectives"])
    one = programs["one"][name]["temp_bytes"]
    assert program["temp_bytes"] <= 1.1 * one + 2**16, (name, program["temp_bytes"], one)
  assert programs["kernels_allowed"] == {"per_device": True, "partitioned": False}
  assert "all-reduce" in programs["partitioned"]["sum"]["collectives"]
  assert "all-gather" in programs["partitioned"]["gather"]["collectives"]


def test_replicas_on_one_device_reduce_as_on_several():
  """Two replicas vmapped on one device: the mean, sum and max over replicas, per-row
  outputs concatenated in order."""
  mesh = mesh_lib.data_mesh(jax.devices()[:1])

  def fn(w, x):
    local = jnp.sum(x * w, axis=-1)
    return dp.mean(jnp.mean(local)), dp.total(jnp.sum(x)), dp.maximum(jnp.max(x)), local * 2

  x = jnp.arange(24.0).reshape(4, 6)
  w = jnp.linspace(-1.0, 1.0, 6)
  run = jax.jit(dp.per_device(fn, mesh, in_specs=(dp.SAME, dp.ROWS),
                              out_specs=(dp.SAME, dp.SAME, dp.SAME, dp.ROWS), replicas=2))
  mean, total, top, rows = run(w, x)
  xs, local = np.asarray(x, np.float64), np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  np.testing.assert_allclose(mean, np.mean([local[:2].mean(), local[2:].mean()]), rtol=1e-6)
  np.testing.assert_allclose(total, xs.sum(), rtol=1e-6)
  assert float(top) == 23.0
  np.testing.assert_allclose(rows, 2 * local, rtol=1e-6)


def test_replicas_must_split_over_devices_and_run_inside():
  mesh = mesh_lib.data_mesh(jax.devices()[:1])
  with pytest.raises(ValueError, match="inside per_device"):
    dp.mean(jnp.ones(()))
  if len(jax.devices()) == 1:
    return
  with pytest.raises(ValueError, match="do not split over"):
    dp.per_device(lambda x: x, mesh_lib.data_mesh(jax.devices()[:2]), (dp.ROWS,), dp.ROWS,
                  replicas=3)
  del mesh


def test_routing_split_and_merge_round_trip():
  """Per-token routing outputs come back in row order, per-expert counts summed."""
  mesh = mesh_lib.data_mesh(jax.devices()[:1])
  ids = jnp.array([[0, 1], [1, 2], [3, 3], [0, 2]])

  def fn(ids):
    return dp.split_routing({1: {"topk_ids": ids, dp.COUNTS: jnp.bincount(ids.reshape(-1),
                                                                          length=4)}})

  rows, counts = jax.jit(dp.per_device(fn, mesh, (dp.ROWS,), (dp.ROWS, dp.SAME),
                                       replicas=2))(ids)
  merged = dp.merge_routing(rows, counts)
  np.testing.assert_array_equal(merged[1]["topk_ids"], ids)
  np.testing.assert_array_equal(merged[1][dp.COUNTS], [2, 2, 2, 2])


@pytest.mark.slow  # an option, off by default; 11-13 s each
@pytest.mark.parametrize("scan_layers", [False, True], ids=["loop", "scan"])
def test_gradients_reduced_per_layer_equal_reduced_at_the_end(scan_layers):
  """Each layer's gradients averaged where the backward pass leaves it (the train step's
  default) give the state and metrics of the whole gradient averaged at the end: 2
  replicas on one device, the layers looped (bit for bit) or scanned over params stored
  stacked. There the vmapped replicas' sum can fuse with a layer's own sums over its
  tokens (the norms' weights), in another order: equal to float32 rounding. On devices
  the all-reduce fuses with nothing, and the scan is bit for bit too
  (tests/integration/test_multidevice.py, 4 devices)."""
  from fp8jax.models import config as mc  # pylint: disable=import-outside-toplevel
  from fp8jax.models import deepseek_model  # pylint: disable=import-outside-toplevel
  from fp8jax.train import optim  # pylint: disable=import-outside-toplevel
  from fp8jax.train import step as step_lib  # pylint: disable=import-outside-toplevel

  cfg = mc.tiny(dtype="float32")
  model = deepseek_model.model(cfg, deepseek_model.Options(scan=scan_layers or None))
  mesh = mesh_lib.data_mesh(jax.devices()[:1])
  tx = optim.optimizer(optim.OptimConfig(peak_lr=3e-3, warmup_steps=1, total_steps=20))
  state = step_lib.seeded_init(model, tx, policy_lib.BF16, stacked=scan_layers)(0)
  tokens = jax.random.randint(jax.random.key(3), (4, 16), 0, cfg.vocab_size)
  outs = {}
  for per_layer in (True, False):
    step = jax.jit(step_lib.make_train_step(model, tx, mesh=mesh, replicas=2,
                                            reduce_per_layer=per_layer))
    outs[per_layer] = step(state, tokens)
  new, metrics = outs[True]
  assert bool(metrics["finite"])
  if scan_layers:
    jax.tree.map(lambda a, b: np.testing.assert_allclose(  # 1e-6 of each leaf's largest
        a, b, rtol=0, atol=1e-6 * float(np.max(np.abs(b)))), outs[True], outs[False])
  else:
    equal = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
                         outs[True], outs[False])
    assert all(jax.tree.leaves(equal)), equal
  # The replicas' gradients differ (their rows do): one replica's norm is not the mean's.
  alone = jax.jit(step_lib.make_train_step(model, tx))(state, tokens[:2])
  assert float(alone[1]["grad_norm"]) != float(metrics["grad_norm"])
  del new


def test_mean_in_backward_averages_only_the_cotangent():
  """Forward: the tree unchanged; backward: the gradient averaged over the replicas."""
  mesh = mesh_lib.data_mesh(jax.devices()[:1])

  def fn(w, x):
    g = jax.grad(lambda w: jnp.sum(dp.mean_in_backward({"w": w})["w"] * x))(w)
    return dp.mean_in_backward(w), g

  w, x = jnp.arange(3.0), jnp.arange(12.0).reshape(2, 6)
  same, g = jax.jit(dp.per_device(fn, mesh, (dp.SAME, dp.ROWS), (dp.SAME, dp.SAME),
                                  replicas=2))(w, x[:, :3].reshape(2, 3))
  np.testing.assert_array_equal(same, w)
  np.testing.assert_array_equal(g, x[:, :3].mean(axis=0))


@pytest.mark.slow
def test_paired_evaluator_reduces_per_layer_as_at_the_end():
  """The paired evaluation with each layer's gradients averaged in the backward pass
  (``StudyModel.param_transform``) gives the rows of the whole gradient averaged after
  it: 2 replicas on one device, to float32 rounding (the vmapped replicas' sums may fuse
  in another order, as in the train step's test above)."""
  import dataclasses  # pylint: disable=import-outside-toplevel

  from fp8jax.models import config as mc  # pylint: disable=import-outside-toplevel
  from fp8jax.models import deepseek_model, deepseek_moe  # pylint: disable=import-outside-toplevel
  from fp8jax.study.comparison import paired  # pylint: disable=import-outside-toplevel

  cfg = mc.tiny(dtype="float32")
  policy = policy_lib.parse_policy("moe_l1-2_e4m3")
  params = deepseek_moe.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (4, 16), 0, cfg.vocab_size)
  rows = []
  for per_layer in (True, False):
    model = dataclasses.replace(deepseek_model.model(cfg), param_transform=per_layer)
    ev = paired.PairedEvaluator(model, [policy], mesh_lib.data_mesh(jax.devices()[:1]),
                                telemetry=False, replicas=2)
    base = ev.baseline(params, tokens)
    rows.append(jax.device_get(ev.variant(policy.name, params, tokens, base)["compare"]))
  def numbers(row):  # the global metrics and the per-layer table's columns
    out = {f"global/{k}": v for k, v in row["global"].items()}
    out.update({f"by_layer/{k}": v for k, v in row["by_layer"].columns.items()
                if np.asarray(v).dtype.kind == "f"})
    return out

  got, want = numbers(rows[0]), numbers(rows[1])
  assert got.keys() == want.keys() and len(got) > 5
  for key, value in got.items():
    np.testing.assert_allclose(np.asarray(value, np.float64),
                               np.asarray(want[key], np.float64), rtol=1e-5, atol=1e-9,
                               err_msg=key)
