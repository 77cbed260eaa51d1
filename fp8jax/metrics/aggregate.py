"""Grouping of per-leaf partial sums by module, coarse group, layer and module x layer.

Partial sums are float32 arrays whose last axis holds K named sums (e.g. sums of squares);
one row per leaf. Groups are static functions of the paths, so a grouping is a constant
bool membership matrix and all groups are summed in one vectorized step. Every aggregate
is a plain sum over leaves, so norms derived from sums of squares compose exactly: the
squared module norms add up to the squared global norm, and likewise for layers and module
x layer cells (plus the layer-less leaves, under the layer key "none").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fp8jax.metrics import paths as paths_lib
from fp8jax.metrics.table import Table

GROUPINGS = ("by_module", "by_group", "by_layer", "by_module_layer")
"""Groupings of a grouped result besides "global" (module x layer holds layer leaves only)."""


def sum_sq(x: jax.Array, axis: int | tuple[int, ...] | None = None) -> jax.Array:
  """Sum of squares of ``x`` accumulated in float32 (any float input dtype)."""
  x = jnp.asarray(x).astype(jnp.float32)
  return jnp.sum(x * x, axis=axis)


def group_keys(path: str, classifier: paths_lib.Classifier) -> dict[str, str]:
  """The key of ``path`` in each grouping (:data:`GROUPINGS`) it belongs to, as
  ``classifier`` (the model's) sees it."""
  cls = classifier
  module, layer = cls.module_of(path), cls.layer_of(path)
  keys = {"by_module": module, "by_group": cls.group_of(module),
          "by_layer": paths_lib.layer_key(layer)}
  if layer is not None:
    keys["by_module_layer"] = paths_lib.module_layer_key(module, layer)
  return keys


def membership(paths: Sequence[str], classifier: paths_lib.Classifier
               ) -> tuple[list[tuple[str, str]], np.ndarray]:
  """Static group membership of leaves.

  Returns:
    ``(groups, member)``: ``groups`` lists ``("global", "")`` then ``(grouping, key)`` in
    first-seen order; ``member`` is bool [len(groups), len(paths)].
  """
  groups: dict[tuple[str, str], list[int]] = {("global", ""): list(range(len(paths)))}
  for i, path in enumerate(paths):
    for grouping, key in group_keys(path, classifier).items():
      groups.setdefault((grouping, key), []).append(i)
  member = np.zeros((len(groups), len(paths)), bool)
  for g, idx in enumerate(groups.values()):
    member[g, idx] = True
  return list(groups), member


def masked_sum(totals: jax.Array, member: np.ndarray) -> jax.Array:
  """Sums of leaf rows per group: totals [L, K], member bool [N, L] -> [N, K].

  A ``where`` (not a product with 0/1) keeps a non-finite leaf out of other groups.
  """
  picked = jnp.where(jnp.asarray(member)[:, :, None], totals[None, :, :], 0.0)
  return jnp.sum(picked, axis=1)


def grouped(paths: Sequence[str], totals: jax.Array,
            to_stats: Callable[[jax.Array], Mapping[str, jax.Array]],
            classifier: paths_lib.Classifier) -> dict:
  """Per-parameter and grouped metrics of leaf partial sums.

  Args:
    paths: the L leaf paths.
    totals: float32 [L, K] partial sums per leaf (reduced over every axis).
    to_stats: maps sums [N, K] to ``{stat: [N]}``.
    classifier: the paths' grouping (the model's :class:`~fp8jax.metrics.paths.Classifier`).

  Returns:
    ``{"global": {stat: scalar}, "per_param": Table {path}, "by_module": Table {module},
    "by_group", "by_layer", "by_module_layer"}`` (:class:`Table` rows ``{stat: scalar}``);
    empty groups are absent.
  """
  groups, member = membership(paths, classifier)
  stats = to_stats(masked_sum(totals, member))
  out: dict = {"global": {k: v[0] for k, v in stats.items()}}
  for grouping in GROUPINGS:
    rows = [i for i, (g, _) in enumerate(groups) if g == grouping]
    out[grouping] = Table([groups[i][1] for i in rows],
                          {k: v[np.asarray(rows, np.int32)] for k, v in stats.items()})
  out["per_param"] = Table(paths, to_stats(totals))
  return out


def stack_rows(rows: Mapping[str, jax.Array],
               to_stats: Callable[[jax.Array], Mapping[str, jax.Array]]) -> Table:
  """A :class:`Table` of ``to_stats`` over rows of partial sums ``{name: [..., K]}`` of one
  shape (e.g. per-expert sums [E, K]): columns [N, ...]."""
  names = list(rows)
  if not names:
    return Table([], {})
  return Table(names, to_stats(jnp.stack([rows[n] for n in names])))


def by_expert(per_slice: Mapping[str, jax.Array],
              classifier: paths_lib.Classifier) -> dict[str, jax.Array]:
  """Per-expert partial sums of each MoE layer: ``{"<i>": [E, K]}``, adding the
  stacked routed-expert leaves of the layer.

  Args:
    per_slice: ``{path: [E, K]}`` of the routed-expert leaves.
    classifier: the paths' layers (the model's :class:`~fp8jax.metrics.paths.Classifier`).
  """
  out: dict[str, jax.Array] = {}
  for path, sums in per_slice.items():
    key = paths_lib.layer_key(classifier.layer_of(path))
    out[key] = sums if key not in out else out[key] + sums
  return out
