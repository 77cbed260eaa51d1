"""Parameter paths of a params tree: flattening, layer keys, classifiers (model-agnostic).

A path is the "/"-joined key sequence of a leaf, e.g. ``"layers/3/attn/out/kernel"``
(layer keys are ints in the tree and decimal strings in the path). A model's
:class:`Classifier` tells the module, coarse group and layer of each of its paths (DeepSeek-MoE's
is ``fp8jax.models.param_paths.DEEPSEEK``; :meth:`Classifier.from_patterns` builds one from
regexes); the grouping functions of :mod:`fp8jax.metrics` take it as ``classifier``.

A "direct" predicate tells which parameters sit in a directly quantized module. It can be
given as a callable on the path, a collection of path prefixes, or a collection of
``(module, layer)`` pairs (``layer`` None: every layer; modules as a classifier names them);
:func:`as_predicate` turns any of these into a callable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
import dataclasses
import re
from typing import Any

import jax


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


def split_path(path: str | Iterable[Any]) -> list[str]:
  """The key strings of a path, given "/"-joined or as a ``jax.tree_util`` key path."""
  if isinstance(path, str):
    return path.split("/")
  return [_key_str(k) for k in path]


def layer_key(layer: int | None) -> str:
  """The string key of a layer in grouped results: "3", or "none" outside the layers."""
  return "none" if layer is None else str(layer)


def module_layer_key(module: str, layer: int) -> str:
  """The key of a (module, layer) cell, e.g. "attn/3"."""
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

  def to_table(self, paths: Iterable[str]) -> dict[str, Any]:
    """The classification of ``paths`` as JSON (``modules``: the table order; ``paths``:
    ``{path: [module, layer or None, group, is expert stack]}``), which
    :meth:`from_table` reads back: a results folder keeps its model's grouping."""
    rows = {}
    for p in paths:
      module = self.module_of(p)
      rows[p] = [module, self.layer_of(p), self.group_of(module), bool(self.is_expert_stack(p))]
    return {"modules": list(self.modules), "paths": rows}

  @classmethod
  def from_table(cls, table: Mapping[str, Any]) -> Classifier:
    """The classifier of a :meth:`to_table` record (a path it does not list: module
    "other", no layer)."""
    rows = {p: tuple(v) for p, v in table["paths"].items()}
    groups = {m: g for m, _, g, _ in rows.values()}
    return cls(lambda p: rows[p][0] if p in rows else "other",
               lambda p: rows[p][1] if p in rows else None,
               lambda m: groups.get(m, "other"),
               lambda p: bool(rows[p][3]) if p in rows else False,
               tuple(table.get("modules", ())))

  def order(self, names: Iterable[str]) -> list[str]:
    """``names`` (unique) in table order: those of :attr:`modules` first, then sorted."""
    names = set(names)
    return [m for m in self.modules if m in names] + sorted(names - set(self.modules))


Direct = Callable[[str], bool] | str | Iterable[str] | Iterable[tuple[str, int | None]]


def as_predicate(direct: Direct | None, classifier: Classifier
                 ) -> Callable[[str], bool] | None:
  """A callable ``path -> bool`` from any accepted "direct" description (None stays None).

  Strings are path prefixes matched at "/" boundaries ("layers/0/attn/out" matches
  ".../out/kernel"); pairs are ``(module, layer)`` with ``layer`` None for all layers,
  modules as ``classifier`` (the model's :class:`Classifier`) names them.
  """
  if direct is None or callable(direct):
    return direct
  items = [direct] if isinstance(direct, str) else list(direct)
  prefixes = [p.rstrip("/") for p in items if isinstance(p, str)]
  pairs = [tuple(p) for p in items if not isinstance(p, str)]
  cls = classifier
  for pair in pairs:
    if len(pair) != 2 or (cls.modules and pair[0] not in cls.modules):
      raise ValueError(f"bad (module, layer) pair {pair!r}; modules: {cls.modules}")

  def predicate(path: str) -> bool:
    if any(path == p or path.startswith(p + "/") for p in prefixes):
      return True
    module, layer = cls.module_of(path), cls.layer_of(path)
    return any(m == module and (lay is None or lay == layer) for m, lay in pairs)

  return predicate
