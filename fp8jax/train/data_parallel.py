"""Data parallelism as one program per device (``jax.shard_map`` over the ``data`` axis).

Each device computes the objective and its gradients on its own rows of the batch, then
the results are combined across the devices: the loss and gradients averaged (one
all-reduce), per-token outputs concatenated along the batch, counts summed. The program
each device compiles is the one-device program at the per-device batch plus those
reductions, so its compile time and memory are those of one device. (Under GSPMD alone
XLA partitions the whole model, sorts and kernels' custom calls included, and may gather
activations across devices.)

The devices are data-parallel replicas, as on real hardware (and several replicas can
share one device, so that fewer devices compute what more would: ``replicas``):

* the loss and the gradients are the means over replicas of each replica's mean, which
  is the global mean since every replica holds the same number of rows;
* a quantizer's per-tensor amax (current scaling) is that of the replica's own rows, as
  Transformer Engine computes it for activations and their gradients without an amax
  reduction group; tiles and blocks (1 x 128, 128 x 128, MX, NVFP4) lie within one
  replica's rows wherever its rows are a multiple of the tile;
* the amax histories of delayed scaling are combined by max across the replicas: every
  replica pushes the largest amax of the step (Transformer Engine's ``reduce_amax``);
* the MoE dispatches each replica's tokens on its own (as ``moe_groups`` did);
* DeepSeek-MoE's balance loss is per sequence (``seq_aux``), hence unchanged; without
  ``seq_aux`` its statistics are per replica.

With FSDP the params come split over the devices instead, and each device gathers a
part's weights where the model uses it (:func:`gather_in_forward`): its gradient then
arrives reduce-scattered, the device's part only (:func:`finish_gathered`).

So a result depends on the number of replicas, as a real run's does, and not on the
devices that carry them. With one replica every reduction is the identity and the
results are those of the plain program.
"""

from __future__ import annotations

import contextvars
import functools
import re

import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from fp8jax.models import layer_scan, layer_stack

AXIS = "data"
REPLICA = "replica"  # the vmapped axis of several replicas on one device
ROWS = PartitionSpec(AXIS)  # split along the batch: each replica's own rows
SAME = PartitionSpec()  # the same on every replica (replicated, or reduced)

# The routing outputs' per-expert counts (``deepseek_moe.apply``'s ``aux["routing"]``);
# every other routing leaf is per token, [B, ...].
COUNTS = "expert_counts"

_axes = contextvars.ContextVar("fp8jax_data_parallel_axes", default=None)


def per_device(fn, mesh, in_specs, out_specs, replicas: int | None = None):
  """``fn`` run by each replica on its own part of the inputs, as laid out by
  ``in_specs`` (:data:`ROWS` or :data:`SAME` per input, pytree prefixes); its outputs
  assembled as ``out_specs`` say. ``fn`` must itself make every :data:`SAME` output equal
  on all replicas (:func:`mean`, :func:`maximum`, :func:`total`). ``in_specs``: a tuple,
  one spec per argument; ``out_specs``: one spec, or a tuple of one per output.

  ``replicas``: the number of data-parallel replicas (default: one per device of
  ``mesh``); a multiple of the devices, each device then runs ``replicas / devices`` of
  them side by side (``jax.vmap``), so that fewer devices compute what more would.
  """
  n = mesh.shape[AXIS]
  replicas = replicas or n
  if replicas % n:
    raise ValueError(f"{replicas} data-parallel replicas do not split over the {n} devices "
                     "of the mesh; use a multiple of them")
  per = replicas // n
  single = isinstance(out_specs, PartitionSpec)
  in_axes = tuple(0 if spec == ROWS else None for spec in in_specs)
  out_axes = tuple(0 if spec == ROWS else None for spec in ((out_specs,) if single
                                                             else out_specs))

  def split(x):
    return x.reshape(per, x.shape[0] // per, *x.shape[1:])

  def merge(x):
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])

  def body(*args):
    token = _axes.set(AXIS if per == 1 else (AXIS, REPLICA))
    try:
      if per == 1:
        return fn(*args)
      args = [jax.tree.map(split, a) if ax == 0 else a for a, ax in zip(args, in_axes)]
      out = jax.vmap(fn, in_axes=in_axes, out_axes=out_axes[0] if single else out_axes,
                     axis_name=REPLICA)(*args)
      out = (out,) if single else out
      out = tuple(jax.tree.map(merge, o) if ax == 0 else o for o, ax in zip(out, out_axes))
      return out[0] if single else out
    finally:
      _axes.reset(token)

  return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       check_vma=False)  # the Pallas kernels have no varying-axes rule


def check_replicas(replicas: int, mesh, batch: int) -> int:
  """The number of replicas (``replicas``, or one per device of ``mesh`` for 0), checked
  to be a multiple of the devices that divides ``batch`` (rows)."""
  n = mesh.shape[AXIS]
  replicas = replicas or n
  if replicas < 1 or replicas % n or batch % replicas:
    raise ValueError(f"{replicas} data-parallel replicas must be a multiple of the {n} "
                     f"devices and divide the batch of {batch}")
  return replicas


def _bound_axes():
  axes = _axes.get()
  if axes is None:
    raise ValueError("data_parallel reductions run only inside per_device")
  return axes


def mean(tree):
  """The mean over the replicas of every leaf (inside :func:`per_device`)."""
  return lax.pmean(tree, _bound_axes())


def mean_in_backward(tree, where=None):
  """``tree`` unchanged; its cotangent (the gradient with respect to it) averaged over the
  replicas (inside :func:`per_device`). Applied where a part of the params is used (each
  decoder layer's where that layer runs: ``deepseek_moe.apply``'s ``param_transform``),
  each part's gradient is averaged as soon as the backward pass has it, so that its
  all-reduce runs while the backward pass goes on through the layers before it, instead of
  one reduction of the whole gradient at the end. The same values as :func:`mean` of the
  gradient, element by element. ``where`` (the model's name for the part) is not read."""
  del where
  return _mean_in_backward(_bound_axes(), tree)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mean_in_backward(axes, tree):
  del axes
  return tree


def _mean_in_backward_fwd(axes, tree):
  del axes
  return tree, None


def _mean_in_backward_bwd(axes, _, cotangent):
  def one(ct):
    if ct.dtype == jax.dtypes.float0:  # integer leaves have no gradient to reduce
      return ct
    return lax.pmean(ct, axes)
  return (jax.tree.map(one, cotangent),)


_mean_in_backward.defvjp(_mean_in_backward_fwd, _mean_in_backward_bwd)


def _key_path(path) -> str:
  """"self_attn/q_proj/kernel" of a key path (dict keys only: an nnx ``State``'s leaves
  add ``.value``)."""
  return "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def sharded_parts(specs) -> dict[tuple[str, str], PartitionSpec]:
  """The ``PartitionSpec`` of every leaf of a params tree split over the devices (``specs``:
  a tree of them like the params, e.g. of :func:`fp8jax.train.mesh.fsdp_sharding`), keyed
  as ``deepseek_moe.apply``'s ``param_transform`` sees the leaf: ``(where, path in the
  part)``, ``where`` a top-level key or ``layer_scan.LAYER`` for every decoder layer (a stacked
  run's specs without their run axis). Alike layers must be split alike."""
  table: dict[tuple[str, str], PartitionSpec] = {}
  for path, spec in jax.tree_util.tree_flatten_with_path(
      specs, is_leaf=lambda x: isinstance(x, PartitionSpec))[0]:
    keys = _key_path(path).split("/")
    if keys[0] in (layer_stack.LAYERS, layer_stack.RUNS):
      where, rest = layer_scan.LAYER, "/".join(keys[2:])
      if keys[0] == layer_stack.RUNS:  # the run axis is never split
        spec = PartitionSpec(*tuple(spec)[1:])
    else:
      where, rest = keys[0], "/".join(keys[1:])
    if table.setdefault((where, rest), spec) != spec:
      raise ValueError(f"the layers' {rest} are split differently: {table[(where, rest)]} "
                       f"and {spec}")
  return table


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gather_as(leaf, axis: int, dtype):
  """``leaf`` cast to ``dtype`` and all-gathered along ``axis``; its transpose
  reduce-scatters the cotangent in ``leaf``'s own dtype (not in ``dtype``)."""
  return lax.all_gather(leaf.astype(dtype), AXIS, axis=axis, tiled=True)


def _gather_as_fwd(leaf, axis, dtype):
  return _gather_as(leaf, axis, dtype), jnp.zeros((), leaf.dtype)


def _gather_as_bwd(axis, dtype, like, ct):
  del dtype
  return (lax.psum_scatter(ct.astype(like.dtype), AXIS, scatter_dimension=axis,
                           tiled=True),)


_gather_as.defvjp(_gather_as_fwd, _gather_as_bwd)


def gather_in_forward(specs, dtype=None):
  """FSDP in per-device programs: ``fn(tree, where)`` for ``deepseek_moe.apply``'s
  ``param_transform`` that all-gathers each leaf of the part ``where`` split along
  ``data`` (``specs``: as :func:`sharded_parts` takes them) where the part is used, so a
  device holds one layer's whole weights at a time. The gradient with respect to the
  device's part is then the all-gather's transpose, a reduce-scatter: the sum over the
  devices, which :func:`finish_gathered` turns into the mean over the replicas.

  ``dtype``: the split leaves are cast to it before the gather (half the bytes for
  float32 params gathered in bfloat16) and their cotangents reduce-scattered in the
  leaves' own dtype. Where the model casts the weight to ``dtype`` before any use, as it
  casts every split weight to its compute dtype, the values are the same as gathering
  the leaf itself."""
  table = sharded_parts(specs)

  def transform(tree, where):
    def one(path, leaf):
      spec = tuple(table[(where, _key_path(path))])
      if AXIS not in spec:
        return leaf
      if dtype is not None and jnp.dtype(dtype) != leaf.dtype:
        return _gather_as(leaf, spec.index(AXIS), jnp.dtype(dtype))
      return lax.all_gather(leaf, AXIS, axis=spec.index(AXIS), tiled=True)
    return jax.tree_util.tree_map_with_path(one, tree)

  return transform


def finish_gathered(grads, specs):
  """The mean over the replicas of gradients taken through :func:`gather_in_forward`
  (``specs``: the params' ``PartitionSpec``s): the split leaves' reduce-scattered sums
  (summed over the replicas of a device, if several) divided by the replicas; the others
  (small, whole on every device) averaged."""
  axes = _bound_axes()
  replicas = lax.psum(1, axes)

  def one(grad, spec):
    if AXIS not in tuple(spec):
      return lax.pmean(grad, axes)
    if axes != AXIS:
      grad = lax.psum(grad, REPLICA)
    return grad / replicas

  return jax.tree.map(one, grads, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def total(tree):
  """The sum over the replicas of every leaf (inside :func:`per_device`)."""
  return lax.psum(tree, _bound_axes())


def maximum(tree):
  """The largest value over the replicas of every element (inside :func:`per_device`)."""
  return lax.pmax(tree, _bound_axes())


def mean_scattered(tree, specs):
  """:func:`mean` of every leaf, each left split over the devices as ``specs`` (a tree of
  ``PartitionSpec``s like ``tree``, e.g. :func:`fp8jax.train.mesh.fsdp_sharding`'s): a
  reduce-scatter along the leaf's ``data`` dimension, half the bytes of an all-reduce;
  leaves whose spec names no ``data`` dimension are averaged whole. Use the specs as the
  outputs' ``out_specs``."""
  axes = _bound_axes()
  devices = lax.psum(1, AXIS)

  def one(leaf, spec):
    if AXIS not in tuple(spec):
      return lax.pmean(leaf, axes)
    if axes != AXIS:
      leaf = lax.pmean(leaf, REPLICA)
    return lax.psum_scatter(leaf, AXIS, scatter_dimension=tuple(spec).index(AXIS),
                            tiled=True) / devices

  return jax.tree.map(one, tree, specs)


def split_routing(routing: dict) -> tuple[dict, dict]:
  """``{layer: {name: array}}`` routing outputs as ``(per-token part, counts summed over
  the devices)``; :func:`merge_routing` puts them back together (outside)."""
  rows = {layer: {k: v for k, v in r.items() if k != COUNTS} for layer, r in routing.items()}
  counts = {layer: total(r[COUNTS]) for layer, r in routing.items() if COUNTS in r}
  return rows, counts


def merge_routing(rows: dict, counts: dict) -> dict:
  """The inverse of :func:`split_routing`."""
  return {layer: {**r, **({COUNTS: counts[layer]} if layer in counts else {})}
          for layer, r in rows.items()}


def operand_telemetry(tel: dict) -> dict:
  """GEMM operand telemetry sums ``{path: {role: sums}}``
  (:mod:`fp8jax.gemm.operand_telemetry`) over all devices: the ``input`` sums (each
  device's own rows) added, the weights' (``weight``, ``weight_gate``, ...: the same
  replicated parameters on every device) kept."""
  return {path: {role: total(sums) if role == "input" else sums
                 for role, sums in roles.items()} for path, roles in tel.items()}


COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
               "collective-permute")


def collectives(compiled) -> dict[str, list[str]]:
  """The cross-device operations of a compiled program (``jax.stages.Compiled``):
  ``{kind: [result shape, ...]}`` per kind of :data:`COLLECTIVES` found in its optimized
  HLO (an asynchronous pair counted once, by its start)."""
  found: dict[str, list[str]] = {}
  kinds = "|".join(COLLECTIVES)
  pattern = re.compile(rf" = (.+?) ({kinds})(-start)?\(")  # a tuple shape holds spaces
  for line in compiled.as_text().splitlines():
    m = pattern.search(line)
    if m:
      found.setdefault(m.group(2), []).append(m.group(1))
  return found
