"""What a branch-off run measures at each step, against the BF16 branch (pure JAX, jittable).

For a branch ``b`` and the BF16 reference branch ``r`` after update ``t`` on the same batch:

- parameter divergence ``||theta_b - theta_r|| / ||theta_r||`` (float32 sums), globally,
  per module and per layer (the groupings of :mod:`fp8jax.metrics.aggregate`; squares
  compose, so module and layer divergences combine to the global one);
- update cosine ``<d_b, d_r> / (||d_b|| ||d_r||)`` with ``d = theta_t - theta_{t-1}``;
- routing divergence: the fraction of tokens of batch ``t`` whose top-k expert set differs,
  per MoE layer and its mean over the layers (:func:`fp8jax.metrics.routing_divergence`).

The noise-floor branch starts from weights perturbed at BF16 rounding level
(:func:`fp8jax.study.common.noise_floor.perturb`), and the growth rate of a divergence series is
the least-squares slope of its logarithm (:func:`growth_rate`). :func:`record` and
:func:`row` turn a branch's per-step results into its ``branches.jsonl`` line on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fp8jax import metrics
from fp8jax.metrics import aggregate
from fp8jax.metrics import paths as paths_lib
from fp8jax.models import layer_stack, param_paths
from fp8jax.study.common.noise_floor import BF16_UNIT_ROUNDOFF, perturb  # noqa: F401
from fp8jax.train import step as step_lib


def _sums(ref_new, ref_prev, new, prev) -> jax.Array:
  """float32 [5] per leaf: ||b - r||^2, ||r||^2, <d_b, d_r>, ||d_b||^2, ||d_r||^2."""
  f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  r, b = f32(ref_new), f32(new)
  dr, db = r - f32(ref_prev), b - f32(prev)
  return jnp.stack([jnp.sum((b - r) ** 2), jnp.sum(r * r), jnp.sum(db * dr),
                    jnp.sum(db * db), jnp.sum(dr * dr)])


def _stats(sums: jax.Array) -> dict[str, jax.Array]:
  div = jnp.sqrt(sums[..., 0]) / jnp.maximum(jnp.sqrt(sums[..., 1]), 1e-30)
  den = jnp.sqrt(sums[..., 3] * sums[..., 4])
  cos = jnp.where(den > 0, sums[..., 2] / jnp.where(den > 0, den, 1.0), jnp.nan)
  return {"param_div": div, "update_cos": cos}


def compare_step(ref_new, ref_prev, new, prev, routing_ref, routing_new,
                 classifier: paths_lib.Classifier = param_paths.DEEPSEEK) -> dict[str, Any]:
  """One step's comparison of a branch with the BF16 branch; ``classifier``: the model's
  grouping of its parameter paths (default DeepSeek-MoE's).

  Args:
    ref_new, ref_prev: the BF16 branch's params after and before the update (pytrees).
    new, prev: the branch's params after and before its update (same structure).
    routing_ref, routing_new: ``{layer: {"topk_ids", "expert_counts"}}`` of both forwards
      on the step's batch (the model's ``aux["routing"]``; ``{}`` without a router).

  Returns:
    ``{"param_div", "update_cos", "routing_diff"}`` scalars, ``"by_module"`` and
    ``"by_layer"`` :class:`~fp8jax.metrics.table.Table` s with the columns ``param_div`` and
    ``update_cos`` (one array per column keeps compilation fast), ``"routing_by_layer"``
    ``{layer: fraction}``.
  """
  # per layer, whatever the params' layout (layer_stack)
  flat = [metrics.flatten(layer_stack.unstack(t)) for t in (ref_new, ref_prev, new, prev)]
  paths = list(flat[0])
  totals = jnp.stack([_sums(*(f[p] for f in flat)) for p in paths])
  g = aggregate.grouped(paths, totals, _stats, classifier)
  div = metrics.routing_divergence(routing_ref, routing_new)
  frac = {layer: d["topk_set_diff_frac"] for layer, d in div.items()}
  routing = (jnp.mean(jnp.stack(list(frac.values()))) if frac
             else jnp.zeros((), jnp.float32))
  return {"param_div": g["global"]["param_div"], "update_cos": g["global"]["update_cos"],
          "routing_diff": routing, "routing_by_layer": frac,
          "by_module": g["by_module"], "by_layer": g["by_layer"]}


def growth_rate(values: Sequence[float | None]) -> float | None:
  """Least-squares slope of ``log(value)`` against the step index (per step; ``e**rate`` is
  the factor per step) over the positive finite values; None with fewer than two."""
  pts = [(t, math.log(v)) for t, v in enumerate(values)
         if v is not None and math.isfinite(v) and v > 0]
  if len(pts) < 2:
    return None
  t, y = np.array(pts).T
  return float(np.polyfit(t, y, 1)[0])


def _clean(x) -> float | None:
  x = float(x)
  return x if math.isfinite(x) else None


def row(from_step: int, name: str, kind: str, expr: str, series: list[dict]) -> dict:
  """The branches.jsonl line of one branch (``kind``: "reference", "noise" or "policy")
  from its per-step host records (:func:`record`)."""
  per = lambda key: [s[key] for s in series]  # noqa: E731
  keys = lambda field: sorted({k for s in series for k in s[field]})  # noqa: E731
  div = per("param_div")
  return {"from_step": from_step, "branch": name, "kind": kind, "expr": expr,
          "steps": list(range(1, len(series) + 1)), "loss": per("loss"),
          "loss_gap": per("loss_gap"), "loss_rel_gap": per("loss_rel_gap"),
          "param_div": div,
          "param_div_by_module": {m: [s["by_module"].get(m) for s in series]
                                  for m in keys("by_module")},
          "param_div_by_layer": {m: [s["by_layer"].get(m) for s in series]
                                 for m in keys("by_layer")},
          "update_cos": per("update_cos"), "routing_diff": per("routing_diff"),
          "routing_by_layer": {m: [s["routing_by_layer"].get(m) for s in series]
                               for m in keys("routing_by_layer")},
          "growth_rate": None if kind == "reference" else growth_rate(div),
          "finite": per("finite"),
          "nonfinite": next((s["nonfinite"] for s in series if s["nonfinite"]), None)}


def record(step: int, m: dict, ref_loss, cmp: dict | None) -> dict:
  """One step of one branch on the host: ``m`` its step metrics, ``ref_loss`` the
  reference's loss on the batch (None: not finite), ``cmp`` the comparison (None: this
  is the reference)."""
  finite = bool(m["finite"])
  where = None
  if not finite:
    where = f"step {step}: " + (step_lib.first_nonfinite(m["finite_groups"]) or "the loss")
  loss = _clean(m["loss"]) if finite else None
  ok = finite and ref_loss is not None and loss is not None
  rec = {"loss": loss, "finite": finite, "nonfinite": where,
         "loss_gap": (loss - ref_loss) if ok else None,
         "loss_rel_gap": (loss - ref_loss) / ref_loss if ok and ref_loss else None}
  if cmp is None:  # the reference against itself
    return {**rec, "loss_gap": 0.0 if finite else None, "loss_rel_gap": 0.0 if finite else None,
            "param_div": 0.0, "update_cos": 1.0 if finite else None, "routing_diff": 0.0,
            "by_module": {}, "by_layer": {}, "routing_by_layer": {}}
  rec.update(param_div=_clean(cmp["param_div"]),
             update_cos=_clean(cmp["update_cos"]) if ok else None,
             routing_diff=_clean(cmp["routing_diff"]) if ok else None,
             by_module={k: _clean(v) for k, v in cmp["by_module"].column("param_div").items()},
             by_layer={k: _clean(v) for k, v in cmp["by_layer"].column("param_div").items()},
             routing_by_layer={str(k): _clean(v) if ok else None
                               for k, v in cmp["routing_by_layer"].items()})
  return rec
