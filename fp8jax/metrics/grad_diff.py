"""Paired BF16/FP8 gradient comparison on one batch (pure JAX, jittable).

For sparse MoE models a routed expert that no token of the batch chose is "not activated"
in that variant. Following the union construction, its gradient slice counts as zero:

* union:        ||Δg||² = Σ_leaves ||m_f · g_fp8 - m_b · g_bf16||²
* intersection: ||Δg||² = Σ_leaves ||m_f · m_b · (g_fp8 - g_bf16)||²

where ``m_b`` / ``m_f`` are each variant's per-expert activation masks, broadcast over the
leading (expert) axis of the expert stacks (``classifier.is_expert_stack``) and 1 for every
other parameter. So ``union² = intersection² + Σ_{active only in fp8} ||g_fp8||²
+ Σ_{active only in bf16} ||g_bf16||²``. Gradient norms ``norm_bf16`` / ``norm_fp8`` are
those of the zero-filled gradients ``m_b · g_bf16`` / ``m_f · g_fp8``. All sums of squares
are float32.

Typical use on device, fetching only the small result::

    cmp = jax.jit(compare_grads, static_argnames=("direct", "classifier"))
    res = cmp(g_bf16, g_fp8, aux_bf16["routing"], aux_fp8["routing"],
              direct=param_paths.direct_modules(policy, cfg.num_hidden_layers),
              classifier=param_paths.DEEPSEEK)  # fp8jax.models.param_paths
    rows = fp8jax.metrics.to_rows(jax.device_get(res), classifier=param_paths.DEEPSEEK)
"""

from __future__ import annotations

from collections.abc import Mapping
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fp8jax.metrics import aggregate
from fp8jax.metrics import paths as paths_lib

STAT_KEYS = ("diff_norm", "diff_norm_intersection", "norm_bf16", "norm_fp8", "rel_err",
             "rel_err_intersection", "cosine")
"""Metrics of every compared group (scalars, or [E] vectors per expert)."""

SUM_KEYS = ("diff_sq", "inter_diff_sq", "bf16_sq", "fp8_sq", "dot", "inter_bf16_sq")
"""Partial sums of a gradient pair, in the order of the last axis of :func:`leaf_sums`."""

LOSS_KEYS = ("loss_bf16", "loss_fp8", "loss_abs_err", "loss_rel_err")
DIRECT_KEYS = ("diff_norm_direct", "diff_norm_other", "share_direct",
               "share_direct_intersection")


def expert_masks(routing: Mapping[int, Mapping[str, jax.Array]]) -> dict[int, jax.Array]:
  """Activated routed experts per MoE layer: ``{layer: bool [E]}`` (expert_counts > 0).

  Args:
    routing: ``aux["routing"]`` of ``deepseek_moe.apply``: ``{layer: {"expert_counts": int
      [E], ...}}``.
  """
  return {layer: jnp.asarray(r["expert_counts"]) > 0 for layer, r in routing.items()}


def _layer_mask(masks: Mapping | None, layer: int, n_experts: int, path: str):
  if masks is None:
    return None
  if layer in masks:
    mask = masks[layer]
  elif str(layer) in masks:
    mask = masks[str(layer)]
  else:
    raise ValueError(f"{path}: the activation mask has no entry for layer {layer} "
                     f"(it has {sorted(masks, key=str)})")
  if isinstance(mask, Mapping):  # a routing entry
    mask = jnp.asarray(mask["expert_counts"]) > 0
  mask = jnp.asarray(mask)
  if mask.shape != (n_experts,):
    raise ValueError(f"{path}: mask shape {mask.shape} does not match {n_experts} experts")
  return mask if mask.dtype == jnp.bool_ else mask != 0


def _sums(g_bf16: jax.Array, g_fp8: jax.Array, mask_bf16: jax.Array | None,
          mask_fp8: jax.Array | None, per_slice: bool) -> tuple[jax.Array, jax.Array]:
  """(:func:`leaf_sums`, whether the sums of squares of ``g_fp8`` are finite).

  One read of each gradient: the sums over the raw slices (no zero-filled copies), each
  slice's then chosen by the masks; a slice's sums of zeros are 0, so they equal the sums
  of the zero-filled gradients. The second covers masked slices too: where it is True,
  every element of ``g_fp8`` is finite."""
  masked = mask_bf16 is not None or mask_fp8 is not None
  b = jnp.asarray(g_bf16).astype(jnp.float32)
  f = jnp.asarray(g_fp8).astype(jnp.float32)
  if (per_slice or masked) and b.ndim >= 1:
    rows = (b.shape[0], math.prod(b.shape[1:]))  # not -1: a leaf may have no experts
    b, f = b.reshape(rows), f.reshape(rows)
    axis = 1
  else:
    axis = None
  d = f - b
  dd, bb, ff, bf = (jnp.sum(t, axis=axis) for t in (d * d, b * b, f * f, b * f))
  # all() of the slices' sums: a sum over all elements XLA would fold into a second read
  whole = jnp.all(jnp.isfinite(ff))
  if masked:
    yes = jnp.ones(jnp.shape(dd), jnp.bool_)
    mb = yes if mask_bf16 is None else mask_bf16
    mf = yes if mask_fp8 is None else mask_fp8
    both, zero = mb & mf, jnp.zeros((), jnp.float32)
    union = jnp.where(both, dd, jnp.where(mb, bb, jnp.where(mf, ff, zero)))
    dd, bf, inter_b = (jnp.where(both, t, zero) for t in (dd, bf, bb))
    bb, ff = jnp.where(mb, bb, zero), jnp.where(mf, ff, zero)
    sums = jnp.stack([union, dd, bb, ff, bf, inter_b], axis=-1)
  else:
    sums = jnp.stack([dd, dd, bb, ff, bf, bb], axis=-1)
  if masked and not per_slice:
    return jnp.sum(sums, axis=0), whole
  return sums, whole


def leaf_sums(g_bf16: jax.Array, g_fp8: jax.Array, mask_bf16: jax.Array | None = None,
              mask_fp8: jax.Array | None = None, per_slice: bool = False) -> jax.Array:
  """Float32 partial sums of one parameter's gradient pair.

  Args:
    g_bf16, g_fp8: gradients of the same shape (any float dtype).
    mask_bf16, mask_fp8: bool [E] activation masks over axis 0, or None (all active).
    per_slice: reduce over all axes but the first (per-expert sums) instead of all.

  Returns:
    float32 [len(SUM_KEYS)] (or [E, len(SUM_KEYS)] with ``per_slice``): the union
    ``diff_sq``, ``inter_diff_sq``, ``bf16_sq`` and ``fp8_sq`` of the zero-filled
    gradients, their ``dot`` product and ``inter_bf16_sq`` (see :data:`SUM_KEYS`).
  """
  return _sums(g_bf16, g_fp8, mask_bf16, mask_fp8, per_slice)[0]


def _ratio(num: jax.Array, den: jax.Array) -> jax.Array:
  """num / den; 0 where both are 0 and +inf where only den is."""
  ok = den > 0
  return jnp.where(ok, num / jnp.where(ok, den, 1), jnp.where(num == 0, 0.0, jnp.inf))


def stats_from_sums(sums: jax.Array) -> dict[str, jax.Array]:
  """The :data:`STAT_KEYS` metrics of (aggregated) partial sums [..., len(SUM_KEYS)].

  ``rel_err`` = diff_norm / norm_bf16 (0 when both are 0, inf when only the latter is);
  ``rel_err_intersection`` divides by the BF16 norm over the intersection; ``cosine`` of the
  zero-filled gradients is NaN when either norm is 0, and exactly 1 for equal gradients.

  Returns:
    ``{stat: [...]}`` float32.
  """
  diff_sq, inter_sq, b, f, dot, inter_b = (sums[..., i] for i in range(len(SUM_KEYS)))
  ok = (b > 0) & (f > 0)
  sb, sf = jnp.where(ok, b, 1), jnp.where(ok, f, 1)
  cosine = jnp.clip((dot / sb) * jnp.sqrt(sb / sf), -1.0, 1.0)
  diff, inter, norm_b = jnp.sqrt(diff_sq), jnp.sqrt(inter_sq), jnp.sqrt(b)
  return {"diff_norm": diff, "diff_norm_intersection": inter, "norm_bf16": norm_b,
          "norm_fp8": jnp.sqrt(f), "rel_err": _ratio(diff, norm_b),
          "rel_err_intersection": _ratio(inter, jnp.sqrt(inter_b)),
          "cosine": jnp.where(ok, cosine, jnp.nan)}


def loss_errors(loss_bf16: jax.Array, loss_fp8: jax.Array) -> dict[str, jax.Array]:
  """Absolute and relative error of the FP8 loss vs the BF16 loss (float32 scalars).

  Returns:
    ``loss_bf16``, ``loss_fp8``, ``loss_abs_err`` = |fp8 - bf16| and ``loss_rel_err`` =
    |fp8 - bf16| / |bf16|.
  """
  b = jnp.asarray(loss_bf16, jnp.float32)
  f = jnp.asarray(loss_fp8, jnp.float32)
  err = jnp.abs(f - b)
  return {"loss_bf16": b, "loss_fp8": f, "loss_abs_err": err,
          "loss_rel_err": _ratio(err, jnp.abs(b))}


def direct_share(paths: list[str], totals: jax.Array, direct: Any,
                 classifier: paths_lib.Classifier) -> dict[str, jax.Array]:
  """Split of the squared difference between directly quantized parameters and the rest.

  Args:
    paths: the L leaf paths.
    totals: float32 [L, len(SUM_KEYS)] leaf partial sums (:func:`leaf_sums`).
    direct: anything :func:`fp8jax.metrics.paths.as_predicate` accepts.
    classifier: the paths' modules and layers (the model's
      :class:`~fp8jax.metrics.paths.Classifier`).

  Returns:
    :data:`DIRECT_KEYS`: the union difference norms inside / outside the direct set, and
    the direct shares of the squared union and intersection differences (NaN if zero).
  """
  predicate = paths_lib.as_predicate(direct, classifier)
  inside = np.array([bool(predicate(p)) for p in paths])
  sides = aggregate.masked_sum(totals, np.stack([inside, ~inside]))  # [2, K]
  union, inter = SUM_KEYS.index("diff_sq"), SUM_KEYS.index("inter_diff_sq")
  out = {"diff_norm_direct": jnp.sqrt(sides[0, union]),
         "diff_norm_other": jnp.sqrt(sides[1, union])}
  for name, col in (("share_direct", union), ("share_direct_intersection", inter)):
    whole = sides[0, col] + sides[1, col]
    out[name] = jnp.where(whole > 0, sides[0, col] / jnp.where(whole > 0, whole, 1), jnp.nan)
  return out


def compare_grads(g_bf16: Any, g_fp8: Any, mask_bf16: Mapping | None = None,
                  mask_fp8: Mapping | None = None, *, direct: Any = None,
                  loss_bf16: jax.Array | None = None, loss_fp8: jax.Array | None = None,
                  classifier: paths_lib.Classifier, finite_probe: bool = False
                  ) -> dict[str, Any]:
  """Compares two gradient trees of the same params tree (pure JAX, jittable).

  Args:
    g_bf16, g_fp8: gradient pytrees with the same structure and shapes (float32 or bf16).
    mask_bf16, mask_fp8: each variant's activated experts: ``{layer: bool [E]}`` (see
      :func:`expert_masks`) or the routing dict ``aux["routing"]`` itself; None: every
      expert active. When given, it must cover every layer with routed-expert weights.
    direct: which parameters are directly quantized (a callable on the path, path
      prefixes or ``(module, layer)`` pairs; static under jit: use a frozenset or tuple).
    loss_bf16, loss_fp8: the two losses (scalars), both or neither.
    finite_probe: also return ``fp8_sq_finite``, bool [L]: whether the sums of squares of
      each leaf of ``g_fp8`` (all of it, masked experts too; per expert for expert stacks)
      are finite, in leaf order, from the same read as the other sums. Where True, every
      element of the leaf is finite; where False, one is not or a sum overflowed.
    classifier: how the paths group into modules, layers and expert stacks
      (the model's :class:`~fp8jax.metrics.paths.Classifier`, static under jit). A model without
      expert stacks gets empty ``per_expert`` and ``by_expert`` tables.

  Returns:
    A dict of small float32 arrays. ``global`` is ``{stat: scalar}`` over
    :data:`STAT_KEYS`; the groupings are :class:`~fp8jax.metrics.table.Table` s (read-only
    mappings ``name -> {stat: value}``, one [N] array per stat as pytree leaves):
    ``per_param`` {path}; ``per_expert`` {expert-stack path} (values [E]); ``by_expert``
    {"<layer>"} (values [E]: the expert stacks of a layer together); ``by_module``
    {module}; ``by_group`` {coarse group}; ``by_layer`` {"<i>" | "none"};
    ``by_module_layer`` {"<module>/<i>"}. Plus ``direct`` (:data:`DIRECT_KEYS`) when
    ``direct`` is given and ``loss`` (:data:`LOSS_KEYS`) when the losses are.
  """
  if jax.tree.structure(g_bf16) != jax.tree.structure(g_fp8):
    raise ValueError("the two gradient trees differ in structure")
  if (loss_bf16 is None) != (loss_fp8 is None):
    raise ValueError("give both losses or neither")
  cls = classifier
  flat_b, flat_f = paths_lib.flatten(g_bf16), paths_lib.flatten(g_fp8)
  totals, per_slice, probe = [], {}, []
  for path, b in flat_b.items():
    f = flat_f[path]
    if jnp.shape(b) != jnp.shape(f):
      raise ValueError(f"{path}: shapes differ: {jnp.shape(b)} vs {jnp.shape(f)}")
    if cls.is_expert_stack(path) and jnp.ndim(b) >= 1:
      layer = cls.layer_of(path)
      masks = (_layer_mask(m, layer, jnp.shape(b)[0], path) for m in (mask_bf16, mask_fp8))
      per_slice[path], whole = _sums(b, f, *masks, per_slice=True)
      totals.append(jnp.sum(per_slice[path], axis=0))
    else:
      sums, whole = _sums(b, f, None, None, per_slice=False)
      totals.append(sums)
    probe.append(whole)
  paths = list(flat_b)
  totals = jnp.stack(totals)
  out = aggregate.grouped(paths, totals, stats_from_sums, cls)
  out["per_expert"] = aggregate.stack_rows(per_slice, stats_from_sums)
  out["by_expert"] = aggregate.stack_rows(aggregate.by_expert(per_slice, cls), stats_from_sums)
  if direct is not None:
    out["direct"] = direct_share(paths, totals, direct, cls)
  if loss_bf16 is not None:
    out["loss"] = loss_errors(loss_bf16, loss_fp8)
  if finite_probe:
    out["fp8_sq_finite"] = jnp.stack(probe)
  return out
