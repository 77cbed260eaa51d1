"""Metrics for paired BF16/FP8 comparisons of one batch: gradients, weights, routing.

Device side (pure JAX, jittable; small results)::

    from fp8jax import metrics
    res = jax.jit(metrics.compare_grads, static_argnames="direct")(
        g_bf16, g_fp8, aux_bf16["routing"], aux_fp8["routing"],
        direct=metrics.direct_modules(policy, cfg.num_hidden_layers),
        loss_bf16=loss_bf16, loss_fp8=loss_fp8)
    div = jax.jit(metrics.routing_divergence)(aux_bf16["routing"], aux_fp8["routing"])

Host side: :func:`to_rows` / :func:`flat_row` / :func:`routing_rows` (Python scalars for
JSONL or CSV), :func:`heatmap` (module x layer tables) and the top-k ranking and migration
functions of :mod:`fp8jax.metrics.ranking`.

Importing this package has no side effects.
"""

from fp8jax.metrics import aggregate, grad_diff, paths, ranking, routing, rows, table, weights
from fp8jax.metrics.grad_diff import (
    DIRECT_KEYS,
    LOSS_KEYS,
    STAT_KEYS,
    SUM_KEYS,
    compare_grads,
    direct_share,
    expert_masks,
    leaf_sums,
    loss_errors,
    stats_from_sums,
)
from fp8jax.metrics.paths import (
    GROUPS,
    MODULES,
    as_predicate,
    direct_modules,
    flatten,
    group_of,
    is_expert_stack,
    layer_of,
    module_of,
)
from fp8jax.metrics.ranking import (
    direct_share_topk,
    jaccard,
    migration,
    module_counts,
    rank_params,
    rankdata,
    spearman,
    spearman_params,
    top_k,
    topk_overlap,
)
from fp8jax.metrics.routing import ROUTING_KEYS, layer_divergence, routing_divergence
from fp8jax.metrics.rows import flat_row, heatmap, per_param, routing_rows, to_python, to_rows
from fp8jax.metrics.table import Table
from fp8jax.metrics.weights import weight_norms

__all__ = [
    "aggregate", "grad_diff", "paths", "ranking", "routing", "rows", "table", "weights",
    "DIRECT_KEYS", "LOSS_KEYS", "STAT_KEYS", "SUM_KEYS", "compare_grads", "direct_share",
    "expert_masks", "leaf_sums", "loss_errors", "stats_from_sums",
    "GROUPS", "MODULES", "as_predicate", "direct_modules", "flatten", "group_of",
    "is_expert_stack", "layer_of", "module_of",
    "direct_share_topk", "jaccard", "migration", "module_counts", "rank_params", "rankdata",
    "spearman", "spearman_params", "top_k", "topk_overlap",
    "ROUTING_KEYS", "layer_divergence", "routing_divergence",
    "flat_row", "heatmap", "per_param", "routing_rows", "to_python", "to_rows",
    "Table", "weight_norms",
]
