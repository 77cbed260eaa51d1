"""The lines a comparison sweep writes (:mod:`fp8jax.study.comparison.sweep`), from the
paired evaluator's results (:mod:`fp8jax.study.comparison.paired`, host arrays): a row of
``rows.jsonl`` and a line of ``details.jsonl`` per policy result, a ``baseline.jsonl``
line per reference pass.
"""

from __future__ import annotations

import math

import jax

from fp8jax import metrics
from fp8jax.study.common import metric_registry
from fp8jax.study.comparison import paired


def baseline_row(base: paired.Baseline, params) -> dict:
  """The ``baseline.jsonl`` fields of a reference pass ``base``: its losses, gradient norm
  and finiteness (``nonfinite``: the path of its first non-finite gradient, or None)."""
  b = jax.device_get(base._replace(grads=None, routing=None))
  first = int(b.nonfinite)
  return {"loss": float(b.loss), "lm_loss": float(b.lm_loss), "aux_loss": float(b.aux_loss),
          "grad_norm": float(b.grad_norm),
          "finite": bool(b.finite),
          "nonfinite": None if first < 0 else "grads/" + paired.leaf_path(params, first)}


EXPERT_METRICS = metric_registry.expert_names()
"""Per-expert metrics of a details line (``by_expert``: ``{layer: {metric: [E]}}``;
registered with ``expert`` in :mod:`fp8jax.study.common.metric_registry`)."""


def expert_tokens(routing) -> dict[str, list[int]]:
  """``{layer: tokens routed to each expert}`` of a pass's routing (``{}``: no router)."""
  counts = jax.device_get({str(layer): r["expert_counts"] for layer, r in routing.items()
                           if "expert_counts" in r})
  return {layer: [int(c) for c in v] for layer, v in counts.items()}


def result_rows(res: dict, params, ids: dict, routed: dict | None = None
                ) -> tuple[dict, dict]:
  """(rows.jsonl row, details.jsonl line) of one variant result (host arrays) against a
  finite baseline; a model with routed experts adds to the details line its per-expert
  metrics (``by_expert``) and the BF16 pass's tokens per expert (``routed``, from
  :func:`expert_tokens`)."""
  finite = bool(res["finite"])
  where = None
  if not finite:
    first = int(res["nonfinite"])
    where = "fp8 " + ("loss" if first < 0 else "grads/" + paired.leaf_path(params, first))
  row = metrics.flat_row(res["compare"], {**ids, "finite": finite, "nonfinite": where})
  row["lm_loss_fp8"] = float(res["lm_loss_fp8"])
  row["aux_loss_fp8"] = float(res["aux_loss_fp8"])
  if "perturbation_norm" in res:  # the noise floor: its curvature signal
    delta = float(res["perturbation_norm"])
    row["perturbation_norm"] = delta
    row["curvature"] = float(row["diff_norm"]) / delta if delta > 0 else math.nan
  for layer, div in res["routing"].items():
    for k in ("topk_set_diff_frac", "n_only_a", "n_only_b"):
      row[f"routing/{layer}/{k}"] = float(div[k])
  details = {**ids, "per_param": metrics.per_param(res["compare"]),
             "module_layer": {k: float(v) for k, v in
                              res["compare"]["by_module_layer"].column("diff_norm").items()}}
  by_expert = res["compare"]["by_expert"]
  if len(by_expert):
    details["by_expert"] = {layer: {m: [float(v) for v in by_expert.columns[m][i]]
                                    for m in EXPERT_METRICS}
                            for i, layer in enumerate(by_expert.names)}
    details["expert_tokens"] = dict(routed or {})
  if "telemetry" in res:  # a GEMM recipe: its operands' block-scale telemetry
    tel = {k: {m: float(v) for m, v in st.items()} for k, st in res["telemetry"].items()}
    row.update({f"tel/{m}": v for m, v in tel.pop("global").items()})
    details["telemetry"] = tel
  return row, details
