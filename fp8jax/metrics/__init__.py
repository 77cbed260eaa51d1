"""Metrics for paired BF16/FP8 comparisons of one batch: gradients, weights, routing.

Device side (pure JAX, jittable; small results)::

    from fp8jax import metrics
    from fp8jax.models import param_paths  # the model's classifier (DeepSeek-MoE's here)
    res = jax.jit(metrics.compare_grads, static_argnames=("direct", "classifier"))(
        g_bf16, g_fp8, aux_bf16["routing"], aux_fp8["routing"],
        direct=param_paths.direct_modules(policy, cfg.num_hidden_layers),
        loss_bf16=loss_bf16, loss_fp8=loss_fp8, classifier=param_paths.DEEPSEEK)
    div = jax.jit(metrics.routing_divergence)(aux_bf16["routing"], aux_fp8["routing"])

Host side: :func:`to_rows` / :func:`flat_row` / :func:`routing_rows` (Python scalars for
JSONL or CSV), :func:`heatmap` (module x layer tables) and the top-k ranking and migration
functions of :mod:`fp8jax.metrics.ranking`.

The package knows no model: every grouping takes the model's
:class:`~fp8jax.metrics.paths.Classifier` (DeepSeek-MoE's: ``fp8jax.models.param_paths``).

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
from fp8jax.metrics.paths import Classifier, as_predicate, flatten
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
    "Classifier", "as_predicate", "flatten",
    "direct_share_topk", "jaccard", "migration", "module_counts", "rank_params", "rankdata",
    "spearman", "spearman_params", "top_k", "topk_overlap",
    "ROUTING_KEYS", "layer_divergence", "routing_divergence",
    "flat_row", "heatmap", "per_param", "routing_rows", "to_python", "to_rows",
    "Table", "weight_norms",
]
