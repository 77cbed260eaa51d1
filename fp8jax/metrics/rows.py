"""Host-side conversion of metric results into flat rows of Python scalars (JSONL / CSV).

The results of :func:`~fp8jax.metrics.grad_diff.compare_grads` and
:func:`~fp8jax.metrics.weights.weight_norms` share one layout (``global``, ``per_param``,
``by_module``, ...); :func:`to_rows` writes it in long form, one row per group, with a
``scope`` column and the group's identifying columns. Undefined ratios stay NaN.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
import math
from typing import Any

import jax
import numpy as np

from fp8jax.metrics import paths as paths_lib

SCOPES = ("global", "by_module", "by_group", "by_layer", "by_module_layer", "per_param",
          "per_expert", "by_expert")
"""Groupings written by :func:`to_rows`, in order."""

FLAT_SCOPES = ("global", "by_module", "by_group", "by_layer")
"""Groupings :func:`flat_row` writes by default."""


SCOPE_NAMES = {"by_module": "module", "by_group": "group", "by_layer": "layer",
               "by_module_layer": "module_layer", "per_param": "param",
               "per_expert": "expert_param", "by_expert": "expert"}
"""The ``scope`` column of each grouping's rows (and the prefix in :func:`flat_row`)."""


def to_python(value: Any) -> Any:
  """Python scalars (float/int/bool) or lists from arrays, recursively through mappings
  (tables included), fetching device arrays once."""
  return _python(jax.device_get(value))


def _python(value: Any) -> Any:
  if isinstance(value, Mapping):
    return {k: _python(v) for k, v in value.items()}
  arr = np.asarray(value)
  if arr.ndim:
    return arr.tolist()
  return arr.item()


def _layer(key: str) -> int | None:
  return None if key == "none" else int(key)


def _ids(key: str, scope: str, classifier: paths_lib.Classifier) -> dict[str, Any]:
  """The identifying columns of a group key."""
  if scope == "by_module":
    return {"module": key}
  if scope == "by_group":
    return {"group": key}
  if scope in ("by_layer", "by_expert"):
    return {"layer": _layer(key)}
  if scope == "by_module_layer":
    module, layer = paths_lib.split_module_layer_key(key)
    return {"module": module, "layer": layer}
  return {"path": key, "module": classifier.module_of(key), "layer": classifier.layer_of(key)}


def to_rows(result: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
            scopes: Iterable[str] = SCOPES, *, classifier: paths_lib.Classifier
            ) -> list[dict[str, Any]]:
  """Long-form rows of a grouped result.

  Args:
    result: a ``compare_grads`` or ``weight_norms`` result (device or host arrays).
    meta: columns prepended to every row (e.g. ``{"step": 1000, "variant": "moe_e4m3"}``).
    scopes: which groupings to write (:data:`SCOPES`).
    classifier: the model's :class:`~fp8jax.metrics.paths.Classifier` (the ``module`` and
      ``layer`` columns of the per-parameter rows).

  Returns:
    Rows ``{**meta, "scope": ..., <id columns>, <metrics>}``. The ``global`` row also
    holds the ``loss`` and ``direct`` entries when present. The per-expert scopes give
    one row per expert (an ``expert`` column).
  """
  meta = dict(meta or {})
  host = to_python(dict(result))
  rows = []
  for scope in scopes:
    if scope not in host:
      continue
    name = SCOPE_NAMES.get(scope, scope)
    if scope == "global":
      rows.append({**meta, "scope": "global", **host["global"], **host.get("loss", {}),
                   **host.get("direct", {})})
      continue
    for key in sorted(host[scope], key=_sort_key):
      metrics = host[scope][key]
      if scope in ("per_expert", "by_expert"):
        n = len(next(iter(metrics.values())))
        rows.extend({**meta, "scope": name, **_ids(key, scope, classifier), "expert": e,
                     **{m: v[e] for m, v in metrics.items()}} for e in range(n))
      else:
        rows.append({**meta, "scope": name, **_ids(key, scope, classifier), **metrics})
  return rows


def _sort_key(key: str) -> tuple:
  """Numeric-aware ordering of group keys ("2" before "10", "none" last)."""
  return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in key.split("/"))


def flat_row(result: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
             scopes: Iterable[str] = FLAT_SCOPES) -> dict[str, Any]:
  """One flat dict of Python scalars: global metrics by name, grouped ones as
  ``"<scope>/<key>/<metric>"`` (e.g. ``"module/attn/diff_norm"``); no vectors."""
  host = to_python(dict(result))
  row = dict(meta or {})
  for scope in scopes:
    if scope not in host:
      continue
    if scope == "global":
      row.update(host["global"])
      row.update(host.get("loss", {}))
      row.update(host.get("direct", {}))
      continue
    name = SCOPE_NAMES.get(scope, scope)
    for key in sorted(host[scope], key=_sort_key):
      for metric, value in host[scope][key].items():
        if not isinstance(value, list):
          row[f"{name}/{key}/{metric}"] = value
  return row


def per_param(result: Mapping[str, Any], metric: str = "diff_norm") -> dict[str, float]:
  """``{path: value}`` of one per-parameter metric (the input of the ranking functions)."""
  column = jax.device_get(result["per_param"]).column(metric)
  return {p: float(v) for p, v in column.items()}


def heatmap(result: Mapping[str, Any], metric: str = "diff_norm", *,
            classifier: paths_lib.Classifier) -> tuple[list[str], list[int], np.ndarray]:
  """A module x layer table of one metric.

  Returns:
    ``(modules, layers, table)``: the modules present (in the table order of
    ``classifier``, the model's :class:`~fp8jax.metrics.paths.Classifier`, then any other
    names sorted),
    the layers present (ascending) and float64 [len(modules), len(layers)], NaN where a
    layer has no such module.
  """
  column = jax.device_get(result["by_module_layer"]).column(metric)
  return module_layer_grid({k: float(v) for k, v in column.items()}, classifier)


def module_layer_grid(values: Mapping[str, float], classifier: paths_lib.Classifier
                      ) -> tuple[list[str], list[int], np.ndarray]:
  """``{"<module>/<layer>": value}`` as ``(modules, layers, table)`` (see :func:`heatmap`)."""
  cells = {paths_lib.split_module_layer_key(k): v for k, v in values.items()}
  modules = classifier.order(c[0] for c in cells)  # modules it does not list: sorted, after
  layers = sorted({c[1] for c in cells})
  table = np.full((len(modules), len(layers)), math.nan)
  for (module, layer), value in cells.items():
    table[modules.index(module), layers.index(layer)] = value
  return modules, layers, table


def routing_rows(divergence: Mapping[int, Mapping[str, Any]],
                 meta: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
  """One row per MoE layer of a ``routing_divergence`` result; the bool [E] masks
  ``only_a`` / ``only_b`` become lists of expert ids."""
  rows = []
  for layer in sorted(divergence):
    host = to_python(dict(divergence[layer]))
    for side in ("only_a", "only_b"):
      host[side] = [e for e, flag in enumerate(host[side]) if flag]
    rows.append({**dict(meta or {}), "scope": "routing", "layer": int(layer), **host})
  return rows
