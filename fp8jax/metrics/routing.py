"""Routing divergence between two variants on the same batch (pure JAX, jittable).

The routing of a variant is ``aux["routing"]`` of a model's ``apply``
(:class:`fp8jax.models.api.Model`: DeepSeek-MoE's, the Mixtral-style model's, any model
with a router): per MoE layer, ``topk_ids`` int [B, S, k] (distinct experts per token) and
``expert_counts`` int [E], the model's own record of its router's choices.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

ROUTING_KEYS = ("topk_set_diff_frac", "topk_ordered_diff_frac", "topk_mean_overlap",
                "n_tokens_diff", "n_tokens", "n_active_a", "n_active_b", "n_only_a",
                "n_only_b", "only_a", "only_b")
"""Per-layer entries of :func:`routing_divergence`."""


def layer_divergence(topk_a: jax.Array, topk_b: jax.Array, counts_a: jax.Array,
                     counts_b: jax.Array) -> dict[str, jax.Array]:
  """Divergence of one MoE layer's routing.

  Args:
    topk_a, topk_b: int [..., k] chosen experts per token of the two variants.
    counts_a, counts_b: int [E] tokens per expert of the two variants.

  Returns:
    ``topk_set_diff_frac``: fraction of tokens whose top-k expert set differs (order
    ignored); ``topk_ordered_diff_frac``: fraction whose ordered top-k list differs;
    ``topk_mean_overlap``: mean |set_a ∩ set_b| / k; ``n_tokens_diff`` / ``n_tokens``
    (int32); ``only_a`` / ``only_b``: bool [E] experts activated (count > 0) in one variant
    only, with their counts ``n_only_a`` / ``n_only_b`` and ``n_active_a`` / ``n_active_b``.
  """
  topk_a, topk_b = jnp.asarray(topk_a), jnp.asarray(topk_b)
  if topk_a.shape != topk_b.shape:
    raise ValueError(f"top-k shapes differ: {topk_a.shape} vs {topk_b.shape}")
  k = topk_a.shape[-1]
  set_diff = jnp.any(jnp.sort(topk_a, -1) != jnp.sort(topk_b, -1), axis=-1)
  ordered_diff = jnp.any(topk_a != topk_b, axis=-1)
  shared = jnp.sum(jnp.any(topk_a[..., :, None] == topk_b[..., None, :], axis=-1), axis=-1)
  active_a, active_b = jnp.asarray(counts_a) > 0, jnp.asarray(counts_b) > 0
  only_a, only_b = active_a & ~active_b, active_b & ~active_a
  count = lambda x: jnp.sum(x.astype(jnp.int32))
  return {"topk_set_diff_frac": jnp.mean(set_diff.astype(jnp.float32)),
          "topk_ordered_diff_frac": jnp.mean(ordered_diff.astype(jnp.float32)),
          "topk_mean_overlap": jnp.mean(shared.astype(jnp.float32)) / k,
          "n_tokens_diff": count(set_diff), "n_tokens": jnp.int32(set_diff.size),
          "n_active_a": count(active_a), "n_active_b": count(active_b),
          "n_only_a": count(only_a), "n_only_b": count(only_b),
          "only_a": only_a, "only_b": only_b}


def routing_divergence(routing_a: Mapping[int, Mapping[str, jax.Array]],
                       routing_b: Mapping[int, Mapping[str, jax.Array]]
                       ) -> dict[int, dict[str, jax.Array]]:
  """Per-MoE-layer divergence (:func:`layer_divergence`) of two variants' routing.

  Args:
    routing_a, routing_b: ``{layer: {"topk_ids", "expert_counts", ...}}`` of the same batch
      (typically BF16 then FP8); both must have the same layers.

  Returns:
    ``{layer: {key: array}}`` with the keys of :data:`ROUTING_KEYS`.
  """
  if set(routing_a) != set(routing_b):
    raise ValueError(f"the routings cover different layers: {sorted(routing_a)} vs "
                     f"{sorted(routing_b)}")
  return {layer: layer_divergence(routing_a[layer]["topk_ids"], routing_b[layer]["topk_ids"],
                                  routing_a[layer]["expert_counts"],
                                  routing_b[layer]["expert_counts"])
          for layer in sorted(routing_a)}
