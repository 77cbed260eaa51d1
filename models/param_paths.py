"""The parameter paths of DeepSeek-MoE's params tree: modules, coarse groups, layers.

A path is the "/"-joined key sequence of a leaf (:func:`fp8jax.metrics.paths.path_str`),
e.g. ``"layers/3/self_attn/q_proj/kernel"``. Each path belongs to one module
(:data:`MODULES`), one coarse group (:data:`GROUPS`) and at most one layer.
:data:`DEEPSEEK` bundles these functions as the :class:`~fp8jax.metrics.paths.Classifier`
that the grouping functions of :mod:`fp8jax.metrics` take; :func:`direct_modules` derives
the ``(module, layer)`` pairs a precision policy quantizes directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fp8jax.metrics.paths import Classifier, split_path

MODULES = ("embedding", "attn_q", "attn_k", "attn_v", "attn_o", "router", "routed_experts",
           "shared_experts", "dense_mlp", "norms", "head", "other")
"""Module names, in the order used for tables and heatmaps."""

GROUPS = ("attention", "moe", "dense_mlp", "other")
"""Coarse groups: attention projections, MoE (router + experts), dense MLPs, the rest."""

_GROUP_OF = {"attn_q": "attention", "attn_k": "attention", "attn_v": "attention",
             "attn_o": "attention", "router": "moe", "routed_experts": "moe",
             "shared_experts": "moe", "dense_mlp": "dense_mlp"}
_ATTN = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_o"}
_NORMS = ("input_layernorm", "post_attention_layernorm")
_DENSE = ("gate_proj", "up_proj", "down_proj")

# Modules whose linear layers run through the simulated FP8 GEMM (``policy.gemm``).
GEMM_MODULES = ("attn_q", "attn_k", "attn_v", "attn_o", "dense_mlp", "shared_experts",
                "routed_experts")


def layer_of(path: str | Iterable[Any]) -> int | None:
  """The decoder layer index of a path ("layers/<i>/..."), or None outside the layers."""
  parts = split_path(path)
  if len(parts) >= 2 and parts[0] == "layers" and parts[1].isdigit():
    return int(parts[1])
  return None


def module_of(path: str | Iterable[Any]) -> str:
  """The module of a path: one of :data:`MODULES` ("other" for unknown paths)."""
  parts = split_path(path)
  head = parts[0]
  if head == "embed_tokens":
    return "embedding"
  if head == "lm_head":
    return "head"
  if head == "norm":
    return "norms"
  if head != "layers" or layer_of(parts) is None or len(parts) < 3:
    return "other"
  rest = parts[2:]
  if rest[0] in _NORMS:
    return "norms"
  if rest[0] == "self_attn" and len(rest) > 1:
    return _ATTN.get(rest[1], "other")
  if rest[0] == "mlp" and len(rest) > 1:
    name = rest[1]
    if name == "gate":
      return "router"
    if name.startswith("experts_"):
      return "routed_experts"
    if name == "shared_experts":
      return "shared_experts"
    if name in _DENSE:
      return "dense_mlp"
  return "other"


def group_of(module: str) -> str:
  """The coarse group (:data:`GROUPS`) of a module name."""
  return _GROUP_OF.get(module, "other")


def is_expert_stack(path: str | Iterable[Any]) -> bool:
  """True for the stacked routed-expert weights (leading axis: expert)."""
  return module_of(path) == "routed_experts"


def direct_modules(policy: Any, num_layers: int,
                   site_modules: Mapping[str, tuple[str, ...]] | None = None
                   ) -> frozenset[tuple[str, int]]:
  """``(module, layer)`` pairs that a precision policy quantizes directly.

  A site rule marks the modules of ``site_modules[site]`` at its layers (e.g. ``attn_out``
  at layers 0-8 -> ``attn_o`` of layers 0..8; ``moe_out`` -> routed and shared experts).
  The map comes from the model's policy (``policy.site_modules``, DeepSeek-MoE's
  ``fp8jax.models.policy.SITE_MODULES``) unless given.
  A policy with an FP8 GEMM (``policy.gemm``) marks every :data:`GEMM_MODULES` module of
  every layer. Pairs for modules a layer does not have are harmless.

  Args:
    policy: an object with ``rules`` (each with ``site`` and ``layers``, None = all) and
      ``gemm`` attributes, e.g. ``fp8jax.models.policy.PrecisionPolicy``.
    num_layers: the model's number of decoder layers.
    site_modules: the site -> modules map; default ``policy.site_modules`` (none: {}).
  """
  if site_modules is None:
    site_modules = getattr(policy, "site_modules", {})
  pairs = set()
  for rule in policy.rules:
    layers = range(num_layers) if rule.layers is None else rule.layers
    pairs.update((m, int(i)) for m in site_modules.get(rule.site, ()) for i in layers)
  if getattr(policy, "gemm", None) is not None:
    pairs.update((m, i) for m in GEMM_MODULES for i in range(num_layers))
  return frozenset(pairs)


DEEPSEEK = Classifier(module_of, layer_of, group_of, is_expert_stack, MODULES)
"""The classifier of the DeepSeek-MoE params tree (the functions of this module)."""
