"""The report's section on routing and experts, for a model with a router: how a policy
changes the router's choices, and which experts' gradients it changes most.

It reads what the sweep (:mod:`fp8jax.study.comparison.sweep`) derives from the model's
own routing statistics (``aux["routing"]``: each MoE layer's top-k expert ids and tokens
per expert): the rows' routing divergence (``routing/<layer>/topk_set_diff_frac``,
:func:`fp8jax.metrics.routing_divergence` of the reference pass and the policy's on the
same batch) and the details lines' per-expert gradient metrics (``by_expert``: over each
expert's slice of the stacked expert weights that the model's classifier marks, as
:func:`fp8jax.metrics.compare_grads` groups them) with the reference pass's tokens per
expert (``expert_tokens``). A model without a router has neither, and no section. The
metrics and their scales are those of :mod:`fp8jax.study.common.metric_registry`
(``expert``, and ``expert_tokens``); the reference is named by its precision
(:attr:`~fp8jax.study.common.results.Results.reference`).

    experts.routing_table(res)["gemm:nvfp4_recipe"]   # {layer: Stat of the fraction}
    experts.expert_table(res)["gemm:nvfp4_recipe"]    # {(layer, expert): {metric: Stat}}
"""

from __future__ import annotations

from collections import defaultdict
import math

from fp8jax.study.common import metric_registry
from fp8jax.study.common.intervals import Stat, ci
from fp8jax.study.common.results import Results
from fp8jax.study.common.stats import fmt, stat, table
from fp8jax.study.comparison.figures import routing_layers

RANK_BY = "diff_norm"
"""The metric the per-expert table ranks the experts by (its first metric column)."""
EXPERT_METRICS = (RANK_BY, *(m for m in metric_registry.expert_names() if m != RANK_BY))
"""The per-expert metrics the section shows (those registered with ``expert``)."""
TOKENS = "expert_tokens"
"""The reference pass's tokens per expert (a registered metric of ``details.jsonl``)."""


def names(res: Results) -> list[str]:
  """The policies, then the noise floor and the controls (the summary's order)."""
  return res.policies + ([res.floor] if res.floor else []) + list(res.controls)


def routing_table(res: Results) -> dict[str, dict[int, Stat]]:
  """``{name: {MoE layer: Stat}}``: the fraction of tokens whose top-k expert set differs
  from the reference pass's, over the finite rows of every checkpoint (arithmetic mean)."""
  layers = routing_layers(res)
  return {p: {lay: stat(res, f"routing/{lay}/topk_set_diff_frac", p) for lay in layers}
          for p in names(res)}


def expert_table(res: Results) -> dict[str, dict[tuple[int, int], dict[str, Stat]]]:
  """``{name: {(layer, expert): {metric: Stat}}}`` over the finite details lines of every
  checkpoint: :data:`EXPERT_METRICS` and :data:`TOKENS` (the reference pass's tokens
  routed to the expert per batch). Each on its registered scale (geometric means for the
  positive metrics, arithmetic for the cosine and the tokens); an expert that no token
  chose has no ``rel_err`` or ``cosine`` in that batch (NaN, left out)."""
  out = {}
  for p in names(res):
    acc = defaultdict(lambda: defaultdict(list))
    for d in (d for s in res.steps for d in res.details_of(p, s)):
      for layer, cols in d.get("by_expert", {}).items():
        tokens = d.get("expert_tokens", {}).get(layer)
        for m in EXPERT_METRICS:
          for e, v in enumerate(cols.get(m, [])):
            acc[(int(layer), e)][m].append(math.nan if v is None else float(v))
        for e, v in enumerate(tokens or []):
          acc[(int(layer), e)][TOKENS].append(float(v))
    out[p] = {key: {m: ci([v for v in vals if not math.isnan(v)],
                          metric_registry.is_positive(m))
                    for m, vals in cols.items()} for key, cols in sorted(acc.items())}
  return out


def markdown(res: Results, top_k: int = 10) -> list[str]:
  """The section's markdown lines (none for a sweep without routing): the routing
  divergence per policy and MoE layer, then per policy the ``top_k`` (layer, expert)
  pairs with the largest gradient difference norm."""
  routing, experts = routing_table(res), expert_table(res)
  layers = routing_layers(res)
  if not layers and not any(experts.values()):
    return []
  lines, ref = ["## Routing and experts", ""], res.reference
  if layers:
    lines += ["Routing divergence: the fraction of tokens whose top-k expert set differs "
              f"between the {ref} reference pass and the policy's on the same batch, per "
              "MoE layer (mean over the finite rows of every checkpoint; the router's "
              "choices are the model's own routing statistics).", ""]
    rows = []
    for p, by_layer in routing.items():
      means = [by_layer[lay].mean for lay in layers]
      finite = [m for m in means if math.isfinite(m)]
      rows.append([p, *(fmt(m) for m in means),
                   fmt(sum(finite) / len(finite) if finite else math.nan)])
    lines += table(["policy", *(f"layer {lay}" for lay in layers), "mean"], rows)
  if any(experts.values()):
    signed = [m for m in (TOKENS, *EXPERT_METRICS) if not metric_registry.is_positive(m)]
    lines += [f"Per-expert gradient difference: per policy, the {top_k} (MoE layer, "
              "expert) pairs with the largest gradient difference norm over the expert's "
              f"own weights; tokens: routed to the expert per batch in the {ref} reference "
              "pass. Geometric means over the finite batches of every checkpoint "
              f"(arithmetic: {', '.join(signed)}).", ""]
    rows = []
    for p, cells in experts.items():
      def size(key, cells=cells):
        v = cells[key][RANK_BY].mean if RANK_BY in cells[key] else math.nan
        return -v if math.isfinite(v) else math.inf
      for layer, e in sorted(cells, key=lambda k: (size(k), k))[:top_k]:
        c = cells[(layer, e)]
        rows.append([p, layer, e, *(fmt(c[m].mean) if m in c else "n/a"
                                    for m in (TOKENS, *EXPERT_METRICS))])
    lines += table(["policy", "layer", "expert", f"tokens ({ref})", *EXPERT_METRICS], rows)
  return lines
