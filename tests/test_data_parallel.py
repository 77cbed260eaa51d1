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

from fp8jax.train import data_parallel as dp
from fp8jax.train import mesh as mesh_lib

REPO = pathlib.Path(__file__).resolve().parents[1]


def _programs() -> dict:
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable, str(REPO / "tests" / "data_parallel_programs.py")],
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
