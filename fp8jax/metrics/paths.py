"""Parameter paths of a params tree: flattening, modules, layers.

A path is the "/"-joined key sequence of a leaf, e.g. ``"layers/3/self_attn/q_proj/kernel"``
(layer keys are ints in the tree and decimal strings in the path). Each path belongs to one
module (:data:`MODULES`), one coarse group (:data:`GROUPS`) and at most one layer.

A "direct" predicate tells which parameters sit in a directly quantized module. It can be
given as a callable on the path, a collection of path prefixes, or a collection of
``(module, layer)`` pairs (``layer`` None: every layer); :func:`as_predicate` turns any of
these into a callable, and :func:`direct_modules` derives the pairs from a precision policy.

The module-level functions classify the DeepSeek-MoE tree. Another model's paths group
through a :class:`Classifier` (:data:`DEEPSEEK` is the one of DeepSeek-MoE;
:meth:`Classifier.from_patterns` builds one from regexes), which the grouping functions
of :mod:`fp8jax.metrics` take as ``classifier``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
import dataclasses
import re
from typing import Any

import jax

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


def _key_str(key: Any) -> str:
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def path_str(key_path: Iterable[Any]) -> str:
  """The "/"-joined path of a ``jax.tree_util`` key path."""
  return "/".join(_key_str(k) for k in key_path)


def flatten(tree: Any) -> dict[str, Any]:
  """``{path: leaf}`` of a pytree, in ``jax.tree_util`` leaf order."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  flat = {path_str(kp): leaf for kp, leaf in leaves}
  if len(flat) != len(leaves):
    raise ValueError("two leaves of the tree share a path string")
  return flat


def _parts(path: str | Iterable[Any]) -> list[str]:
  if isinstance(path, str):
    return path.split("/")
  return [_key_str(k) for k in path]


def layer_of(path: str | Iterable[Any]) -> int | None:
  """The decoder layer index of a path ("layers/<i>/..."), or None outside the layers."""
  parts = _parts(path)
  if len(parts) >= 2 and parts[0] == "layers" and parts[1].isdigit():
    return int(parts[1])
  return None


def module_of(path: str | Iterable[Any]) -> str:
  """The module of a path: one of :data:`MODULES` ("other" for unknown paths)."""
  parts = _parts(path)
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


def layer_key(layer: int | None) -> str:
  """The string key of a layer in grouped results: "3", or "none" outside the layers."""
  return "none" if layer is None else str(layer)


def module_layer_key(module: str, layer: int) -> str:
  """The key of a (module, layer) cell, e.g. "attn_o/3"."""
  return f"{module}/{layer}"


def split_module_layer_key(key: str) -> tuple[str, int]:
  """Inverse of :func:`module_layer_key`."""
  module, _, layer = key.rpartition("/")
  return module, int(layer)


def _no_group(module: str) -> str:
  del module
  return "other"


def _no_experts(path: str) -> bool:
  del path
  return False


@dataclasses.dataclass(frozen=True)
class Classifier:
  """How the parameter paths of one model group: module, coarse group, layer, experts.

  Attributes:
    module_of: path -> module name.
    layer_of: path -> layer index, or None outside the layers.
    group_of: module name -> coarse group ("other" for all by default).
    is_expert_stack: path -> True for a stacked routed-expert weight (leading axis:
      expert); such leaves get per-expert metrics and the activation masks of the routing.
      A model without routed experts leaves the default (never).
    modules: the module names in table order (names not listed follow, sorted).
  """
  module_of: Callable[[str], str]
  layer_of: Callable[[str], int | None]
  group_of: Callable[[str], str] = _no_group
  is_expert_stack: Callable[[str], bool] = _no_experts
  modules: tuple[str, ...] = ()

  @classmethod
  def from_patterns(cls, modules: Mapping[str, str], layer: str | None = None,
                    groups: Mapping[str, str] | None = None) -> Classifier:
    """A classifier from regexes: ``modules`` ``{name: regex}`` searched in order in the
    path (first match; no match: "other"), ``layer`` a regex whose first group is the
    layer index (e.g. ``r"^layers/(\\d+)/"``), ``groups`` ``{module: group}``.

    Raises:
      ValueError: a regex does not compile, or ``layer`` has no group (naming it).
    """
    def compile_(name, pattern):
      try:
        return re.compile(pattern)
      except re.error as e:
        raise ValueError(f"classifier pattern {name!r}: bad regex {pattern!r}: {e}") from None

    compiled = {name: compile_(name, pattern) for name, pattern in modules.items()}
    layer_re = compile_("layer", layer) if layer else None
    if layer_re is not None and layer_re.groups < 1:
      raise ValueError(f"classifier layer pattern {layer!r} needs a group for the index")
    group_map = dict(groups or {})

    def module_of(path: str) -> str:
      return next((n for n, r in compiled.items() if r.search(path)), "other")

    def layer_of(path: str) -> int | None:
      m = layer_re.search(path) if layer_re is not None else None
      return int(m.group(1)) if m else None

    return cls(module_of, layer_of, lambda m: group_map.get(m, "other"),
               modules=tuple(modules) + ("other",))

  def order(self, names: Iterable[str]) -> list[str]:
    """``names`` (unique) in table order: those of :attr:`modules` first, then sorted."""
    names = set(names)
    return [m for m in self.modules if m in names] + sorted(names - set(self.modules))


Direct = Callable[[str], bool] | str | Iterable[str] | Iterable[tuple[str, int | None]]


def as_predicate(direct: Direct | None, classifier: Classifier | None = None
                 ) -> Callable[[str], bool] | None:
  """A callable ``path -> bool`` from any accepted "direct" description (None stays None).

  Strings are path prefixes matched at "/" boundaries ("layers/0/self_attn/o_proj" matches
  ".../o_proj/kernel"); pairs are ``(module, layer)`` with ``layer`` None for all layers,
  modules as ``classifier`` names them (default: :data:`DEEPSEEK`).
  """
  if direct is None or callable(direct):
    return direct
  items = [direct] if isinstance(direct, str) else list(direct)
  prefixes = [p.rstrip("/") for p in items if isinstance(p, str)]
  pairs = [tuple(p) for p in items if not isinstance(p, str)]
  cls = classifier or DEEPSEEK
  for pair in pairs:
    if len(pair) != 2 or (cls.modules and pair[0] not in cls.modules):
      raise ValueError(f"bad (module, layer) pair {pair!r}; modules: {cls.modules}")

  def predicate(path: str) -> bool:
    if any(path == p or path.startswith(p + "/") for p in prefixes):
      return True
    module, layer = cls.module_of(path), cls.layer_of(path)
    return any(m == module and (lay is None or lay == layer) for m, lay in pairs)

  return predicate


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
"""The classifier of the DeepSeek-MoE params tree (the module-level functions)."""
