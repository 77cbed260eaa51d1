"""Data parallelism with a ``data`` mesh under ``jax.jit`` (no ``pmap``).

The global batch is sharded along ``data``; params and optimizer state are replicated;
the loss is the mean over the global batch, so XLA inserts the gradient all-reduce.
The same code runs on 1..N local devices, and across hosts after
``jax.distributed.initialize()`` (each process then feeds its share of the batch).
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from fp8jax.models import layer_stack


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


def fsdp_sharding(tree, mesh, min_size: int = 2**16):
  """Per-leaf shardings that split each array of at least ``min_size`` elements along
  its largest axis divisible by the ``data`` axis size (others replicated): params and
  optimizer state then take 1/N of the memory per device (ZeRO-3 style; XLA gathers
  the weights where they are used). The run axis of layers stored stacked
  (``layer_runs/...``, :mod:`fp8jax.models.layer_stack`) is never split: the scan takes
  one layer per iteration."""
  n = mesh.shape["data"]

  def one(path, leaf):
    shape = getattr(leaf, "shape", ())
    if n == 1 or not shape or leaf.size < min_size:
      return replicated(mesh)
    first = 1 if layer_stack.in_run(path) else 0
    axes = sorted((a for a in range(first, len(shape)) if shape[a] % n == 0),
                  key=lambda a: -shape[a])
    if not axes:
      return replicated(mesh)
    spec = [None] * len(shape)
    spec[axes[0]] = "data"
    return NamedSharding(mesh, PartitionSpec(*spec))

  return jax.tree_util.tree_map_with_path(one, tree)


def global_batch(local_batch, mesh):
  """A global array sharded on ``data`` from this process's rows (all processes call it
  with their own share; on one process this is a plain sharded ``device_put``)."""
  return jax.make_array_from_process_local_data(batch_sharding(mesh), local_batch)


def under_mesh(fn, mesh):
  """``fn`` called (and so traced) with ``mesh`` as the context mesh (``jax.set_mesh``):
  the model then runs kernels per device in a ``shard_map`` (see
  ``fp8jax.models.deepseek_moe``). A jitted ``fn``'s ``lower`` comes along as
  ``call.lower``, under the mesh too."""
  def call(*args, **kwargs):
    with jax.set_mesh(mesh):
      return fn(*args, **kwargs)
  if hasattr(fn, "lower"):
    def lower(*args, **kwargs):
      with jax.set_mesh(mesh):
        return fn.lower(*args, **kwargs)
    call.lower = lower
  return call


def shard_step(step, mesh, state_sharding=None):
  """jit ``step(state, tokens) -> (state, metrics)`` with the state laid out as
  ``state_sharding`` (default replicated), the batch sharded on ``data`` and replicated
  metrics; the input state is donated. Runs under ``mesh`` (:func:`under_mesh`)."""
  state_sharding = replicated(mesh) if state_sharding is None else state_sharding
  return under_mesh(jax.jit(step, in_shardings=(state_sharding, batch_sharding(mesh)),
                            out_shardings=(state_sharding, replicated(mesh)),
                            donate_argnums=0), mesh)
