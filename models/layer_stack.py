"""Decoder-layer params stored stacked: one tree per run of consecutive alike layers.

A params tree (or any tree that holds one: gradients, the optimizer's moments, a train
state) keeps its decoder layers in one of two layouts:

* per layer (:func:`deepseek_moe.init`'s): ``tree["layers"] = {i: layer params}``;
* stacked: the layers of each run of two or more are one tree whose leaves carry a leading
  axis of the run's length, ``tree["layer_runs"] = {first index: stacked params}``, and
  the other layers stay in ``tree["layers"]``.

``deepseek_moe.apply`` takes either layout. With ``scan_layers=True`` it scans each run
of alike layers (:mod:`fp8jax.models.layer_scan`); a run stored stacked is scanned as it
is stored, with no copy of its weights and with its gradient written in the same layout,
which is what stacked storage is for (MaxText lays its layers out this way). Where the
policy's runs are not the stored ones, the layers are sliced or stacked as needed, with
the same results.

    stacked = layer_stack.stack(params, [[0], [1, 2, 3, 4]])   # runs of the policy
    params == layer_stack.unstack(stacked)                     # bit for bit

:func:`runs` reads the layout back from the leaves' leading axes; :func:`stack` and
:func:`unstack` work on every node of a tree that holds layers (a ``TrainState``, an
optax state), on arrays and ``jax.ShapeDtypeStruct`` leaves alike.
"""

from __future__ import annotations

import operator
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from fp8jax.models import layer_scan

LAYERS = "layers"
RUNS = "layer_runs"


def holds_layers(node) -> bool:
  """Whether ``node`` is a params-like dict: it has ``layer_runs``, or ``layers`` keyed by
  layer index (other models' ``layers`` entries are left alone)."""
  if not isinstance(node, dict):
    return False
  layers = node.get(LAYERS)
  return RUNS in node or (isinstance(layers, dict) and bool(layers)
                          and all(isinstance(k, int) for k in layers))


def _leading(tree) -> int:
  return jax.tree.leaves(tree)[0].shape[0]


def runs(params: dict) -> list[list[int]]:
  """The layer indices of each stored unit of ``params``, in layer order:
  ``[[0], [1, 2, 3, 4]]`` for layer 0 per layer and layers 1-4 stacked."""
  units = [[i] for i in params.get(LAYERS, {})]
  units += [list(range(first, first + _leading(tree)))
            for first, tree in params.get(RUNS, {}).items()]
  return sorted(units)


def in_run(path) -> bool:
  """Whether the leaf at key path ``path`` is stored stacked (its axis 0 runs over the
  layers of its run)."""
  return any(getattr(k, "key", None) == RUNS for k in path)


def _nodes(tree) -> list[dict]:
  """The params-like nodes of ``tree``."""
  return [n for n in jax.tree.leaves(tree, is_leaf=holds_layers) if holds_layers(n)]


def _map_nodes(fn, tree):
  return jax.tree.map(lambda n: fn(n) if holds_layers(n) else n, tree, is_leaf=holds_layers)


def is_stacked(tree) -> bool:
  """Whether any params-like node of ``tree`` holds a stacked run."""
  return any(n.get(RUNS) for n in _nodes(tree))


def _stack_leaves(*xs):
  if isinstance(xs[0], jax.ShapeDtypeStruct):
    sharding = getattr(xs[0], "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):  # the run axis is not sharded
      spec = jax.sharding.PartitionSpec(None, *sharding.spec)
      sharding = jax.sharding.NamedSharding(sharding.mesh, spec)
    return jax.ShapeDtypeStruct((len(xs), *xs[0].shape), xs[0].dtype, sharding=sharding)
  return jnp.stack(xs)


def _index_leaf(x, k: int):
  if isinstance(x, jax.ShapeDtypeStruct):
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
      spec = jax.sharding.PartitionSpec(*tuple(sharding.spec)[1:])
      sharding = jax.sharding.NamedSharding(sharding.mesh, spec)
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=sharding)
  return x[k]


def _per_layer(params: dict) -> dict:
  """``{i: layer params}`` for every layer of one params-like node."""
  out = dict(params.get(LAYERS, {}))
  for first, tree in params.get(RUNS, {}).items():
    for k in range(_leading(tree)):
      out[first + k] = jax.tree.map(lambda x, k=k: _index_leaf(x, k), tree)
  return dict(sorted(out.items()))


def _restack(params: dict, groups) -> dict:
  layers = _per_layer(params)
  out = {k: v for k, v in params.items() if k not in (LAYERS, RUNS)}
  covered = sorted(i for g in groups for i in g)
  if covered != sorted(layers):
    raise ValueError(f"the runs {groups} do not cover the layers {sorted(layers)} once each")
  out[LAYERS] = {g[0]: layers[g[0]] for g in groups if len(g) == 1}
  for g in groups:
    if g != list(range(g[0], g[0] + len(g))):
      raise ValueError(f"a stacked run must be consecutive layers, got {g}")
    shapes = {i: jax.tree.map(lambda x: (x.shape, str(x.dtype)), layers[i]) for i in g}
    if any(shapes[i] != shapes[g[0]] for i in g):
      raise ValueError(f"the layers {g} are not alike (their params differ in structure, "
                       "shape or dtype) and cannot be stacked")
  stacked = {g[0]: jax.tree.map(_stack_leaves, *(layers[i] for i in g))
             for g in groups if len(g) > 1}
  if stacked:
    out[RUNS] = stacked
  return out


def stack(tree: Any, groups) -> Any:
  """``tree`` with the layers of each params-like node stored as ``groups`` (lists of
  consecutive layer indices; every layer once; groups of one stay per layer), from
  either layout."""
  groups = [list(g) for g in groups]
  return _map_nodes(lambda n: _restack(n, groups), tree)


def unstack(tree: Any) -> Any:
  """``tree`` with every params-like node back in the per-layer layout."""
  def one(node):
    out = {k: v for k, v in node.items() if k not in (LAYERS, RUNS)}
    out[LAYERS] = _per_layer(node)
    return out
  return _map_nodes(one, tree)


def reduce_per_layer(reduce, tree: Any) -> Any:
  """``reduce(leaf, axis=...)`` of every leaf of ``tree``, named per layer: a leaf stored
  stacked is reduced over all but its run axis in one pass, and its values split per
  layer (:func:`unstack`); other leaves over all their axes."""
  def one(path, x):
    return reduce(x, axis=tuple(range(1, x.ndim)) if in_run(path) else None)
  return unstack(jax.tree_util.tree_map_with_path(one, tree))


def global_norm(tree: Any) -> jax.Array:
  """The L2 norm of ``tree``'s leaves summed leaf by leaf in the per-layer layout, as
  ``optax.tree.norm(unstack(tree))`` sums it, whatever the layout (stacked leaves are not
  sliced per layer: :func:`reduce_per_layer`)."""
  per_layer = reduce_per_layer(
      lambda x, axis: jnp.sum(jnp.square(x.real) + jnp.square(x.imag), axis=axis), tree)
  return jnp.sqrt(jax.tree.reduce(operator.add, per_layer, initializer=0))


def layout(tree: Any) -> list[list[int]] | None:
  """The stored runs of ``tree``'s first params-like node, or None if it has none."""
  nodes = _nodes(tree)
  return runs(nodes[0]) if nodes else None


def take(params: dict, group: list[int]):
  """The params of the layers ``group`` of one params-like node: a layer's tree for a
  group of one, else a tree stacked along a leading axis. A stored run equal to ``group``
  is returned as it is (no copy); otherwise the stored units are sliced and joined."""
  stored = params.get(RUNS, {})
  if len(group) == 1:
    i = group[0]
    if i in params.get(LAYERS, {}):
      return params[LAYERS][i]
    for first, tree in stored.items():
      if first <= i < first + _leading(tree):
        return jax.tree.map(lambda x, k=i - first: x[k], tree)
    raise KeyError(f"layer {i} is not in the params")
  first = group[0]
  if first in stored and _leading(stored[first]) == len(group):
    return stored[first]
  pieces = []
  i = first
  while i <= group[-1]:
    run = next(((f, t) for f, t in stored.items() if f <= i < f + _leading(t)), None)
    if run is None:
      pieces.append(jax.tree.map(lambda x: x[None], take(params, [i])))
      i += 1
      continue
    f, tree = run
    end = min(f + _leading(tree), group[-1] + 1)
    pieces.append(jax.tree.map(lambda x, a=i - f, b=end - f: x[a:b], tree))
    i = end
  if len(pieces) == 1:
    return pieces[0]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *pieces)


def filled(state, pure: dict):
  """A copy of the nnx ``state`` with the values of the nested dict ``pure``."""
  state = jax.tree.map(lambda x: x, state)
  nnx.replace_by_pure_dict(state, pure)
  return state


def module(layers, i: int, layer_params, transform=None):
  """Decoder layer ``i`` of the modules ``layers``, with its params from ``layer_params``
  (either layout) if given, passed through ``transform(state, layer_scan.LAYER)`` if given
  (``deepseek_moe.apply``'s ``param_transform``)."""
  if layer_params is None and transform is None:
    return layers[i]
  graphdef, state = nnx.split(layers[i])
  if layer_params is not None:
    state = filled(state, take(layer_params, [i]))
  return nnx.merge(graphdef, state if transform is None else transform(state,
                                                                       layer_scan.LAYER))


def run_state(layers, group: list[int], layer_params):
  """(graphdef, stacked param state) of the layers ``group`` for ``layer_scan.scan``: from
  ``layer_params`` (a stored run is used as stored), else stacked from the modules."""
  if layer_params is None:
    return layer_scan.stack_states([layers[i] for i in group])
  graphdef, state = nnx.split(layers[group[0]])
  return graphdef, filled(state, take(layer_params, group))
