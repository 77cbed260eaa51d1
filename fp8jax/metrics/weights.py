"""Weight norms of a params tree, grouped like the gradient comparison (pure JAX, jittable)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fp8jax.metrics import aggregate
from fp8jax.metrics import paths as paths_lib


def _norm(sums: jax.Array) -> dict[str, jax.Array]:
  return {"weight_norm": jnp.sqrt(sums[..., 0])}


def weight_norms(params: Any, classifier: paths_lib.Classifier
                 ) -> dict[str, Any]:
  """L2 norms of the weights (float32 sums of squares), per parameter and per group.

  Args:
    params: a params pytree (e.g. ``deepseek_moe.init(...)``).
    classifier: the paths' grouping (the model's :class:`~fp8jax.metrics.paths.Classifier`,
      e.g. ``fp8jax.models.param_paths.DEEPSEEK``).

  Returns:
    ``{"global": {"weight_norm": scalar}}`` and the :class:`~fp8jax.metrics.table.Table` s
    ``per_param`` {path}, ``per_expert`` {expert-stack path} ([E] values), ``by_expert``
    {"<layer>"} ([E]), ``by_module``, ``by_group``, ``by_layer`` and ``by_module_layer``,
    whose rows are ``{"weight_norm": value}``. Squares compose: the squared module norms
    add up to the squared global norm.
  """
  cls = classifier
  flat = paths_lib.flatten(params)
  totals, per_slice = [], {}
  for path, w in flat.items():
    if cls.is_expert_stack(path) and jnp.ndim(w) >= 1:
      per_slice[path] = aggregate.sum_sq(w, tuple(range(1, jnp.ndim(w))))[:, None]
      totals.append(jnp.sum(per_slice[path], axis=0))
    else:
      totals.append(aggregate.sum_sq(w)[None])
  out = aggregate.grouped(list(flat), jnp.stack(totals), _norm, cls)
  out["per_expert"] = aggregate.stack_rows(per_slice, _norm)
  out["by_expert"] = aggregate.stack_rows(aggregate.by_expert(per_slice, cls), _norm)
  return out


def norms_by_module(params: Any, classifier: paths_lib.Classifier
                    ) -> dict[str, jax.Array]:
  """``{"global" | module: L2 norm}`` of a params tree (scalars; jittable)."""
  norms = weight_norms(params, classifier)
  return {"global": norms["global"]["weight_norm"],
          **{m: v["weight_norm"] for m, v in norms["by_module"].items()}}
