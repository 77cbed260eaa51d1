"""Data parallelism with a ``data`` mesh under ``jax.jit`` (no ``pmap``).

The global batch is sharded along ``data``; params and optimizer state are replicated;
the loss is the mean over the global batch, so XLA inserts the gradient all-reduce.
The same code runs on 1..N local devices, and across hosts after
``jax.distributed.initialize()`` (each process then feeds its share of the batch).
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec


def data_mesh(devices=None) -> jax.sharding.Mesh:
  """A 1-D mesh named ``data`` over ``devices`` (default: all), with automatic (GSPMD)
  sharding propagation, so model code needs no sharding annotations."""
  devices = jax.devices() if devices is None else list(devices)
  return jax.make_mesh((len(devices),), ("data",), devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,))


def batch_sharding(mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec("data"))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def check_global_batch(global_batch: int, mesh) -> None:
  """Raises before any compute when the batch does not split over the devices."""
  n = mesh.devices.size
  if global_batch % n:
    raise ValueError(f"global batch {global_batch} is not divisible by the {n} devices of "
                     "the data mesh")


def shard_step(step, mesh):
  """jit ``step(state, tokens)`` with a replicated state and a batch sharded on ``data``."""
  rep, data = replicated(mesh), batch_sharding(mesh)
  return jax.jit(step, in_shardings=(rep, data), out_shardings=(rep, rep), donate_argnums=0)
