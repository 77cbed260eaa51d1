"""Parameter rankings by gradient difference norm, and their migration across checkpoints.

Host-side NumPy over ``{path: value}`` dicts (e.g. :func:`fp8jax.metrics.rows.per_param`
of each checkpoint's comparison). Rankings are by descending value with ties broken by path,
so they are deterministic; NaN values rank last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
import math
from typing import Any

import numpy as np

from fp8jax.metrics import paths as paths_lib


def rank_params(values: Mapping[str, float]) -> list[str]:
  """Paths by descending value (ties by path; NaN last)."""
  def key(path):
    v = float(values[path])
    return (math.isnan(v), -v if not math.isnan(v) else 0.0, path)
  return sorted(values, key=key)


def top_k(values: Mapping[str, float], k: int) -> list[str]:
  """The ``k`` highest-valued paths (all when fewer), highest first."""
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  return rank_params(values)[:k]


def topk_overlap(a: Sequence[str], b: Sequence[str], k: int | None = None) -> float:
  """|A ∩ B| / k for the first ``k`` entries of two rankings (k: the shorter length)."""
  k = min(len(a), len(b)) if k is None else min(k, len(a), len(b))
  if k < 1:
    return math.nan
  return len(set(a[:k]) & set(b[:k])) / k


def jaccard(a: Iterable[str], b: Iterable[str]) -> float:
  """|A ∩ B| / |A ∪ B| of two sets (NaN when both are empty)."""
  a, b = set(a), set(b)
  return len(a & b) / len(a | b) if a | b else math.nan


def rankdata(x: Sequence[float]) -> np.ndarray:
  """1-based ranks of ``x`` (ascending), ties sharing their average rank (float64 [n])."""
  x = np.asarray(x, np.float64).ravel()
  if np.isnan(x).any():
    raise ValueError("rankdata: NaN values have no rank")
  order = np.argsort(x, kind="stable")
  xs = x[order]
  first = np.concatenate([[True], xs[1:] != xs[:-1]]) if x.size else np.zeros(0, bool)
  starts = np.flatnonzero(first)
  ends = np.concatenate([starts[1:], [x.size]])
  average = (starts + ends - 1) / 2.0 + 1.0
  ranks = np.empty(x.size, np.float64)
  ranks[order] = average[np.cumsum(first) - 1]
  return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  """Spearman rank correlation (Pearson correlation of average ranks); NaN when a side is
  constant or has fewer than 2 entries."""
  rx, ry = rankdata(x), rankdata(y)
  if rx.shape != ry.shape:
    raise ValueError(f"spearman: lengths differ: {rx.size} vs {ry.size}")
  if rx.size < 2:
    return math.nan
  dx, dy = rx - rx.mean(), ry - ry.mean()
  den = math.sqrt(float(np.sum(dx * dx)) * float(np.sum(dy * dy)))
  return float(np.sum(dx * dy)) / den if den > 0 else math.nan


def spearman_params(a: Mapping[str, float], b: Mapping[str, float]) -> float:
  """Spearman correlation of two ``{path: value}`` dicts over their common paths."""
  common = sorted(set(a) & set(b))
  return spearman([a[p] for p in common], [b[p] for p in common])


def direct_share_topk(values: Mapping[str, float], k: int, direct: Any,
                      classifier: paths_lib.Classifier) -> float:
  """Fraction of the top-``k`` paths that are directly quantized.

  Args:
    values: ``{path: value}``.
    k: ranking depth.
    direct: anything :func:`fp8jax.metrics.paths.as_predicate` accepts.
    classifier: the paths' modules and layers (the model's
      :class:`~fp8jax.metrics.paths.Classifier`).
  """
  predicate = paths_lib.as_predicate(direct, classifier)
  top = top_k(values, k)
  return sum(bool(predicate(p)) for p in top) / len(top)


def module_counts(paths: Iterable[str], classifier: paths_lib.Classifier) -> dict[str, int]:
  """How many of ``paths`` fall in each module of ``classifier`` (modules with none are
  left out)."""
  counts: dict[str, int] = {}
  for p in paths:
    m = classifier.module_of(p)
    counts[m] = counts.get(m, 0) + 1
  return counts


def migration(series: Sequence[tuple[Any, Mapping[str, float]]] | Mapping[Any, Mapping],
              k: int, direct: Any = None, *, classifier: paths_lib.Classifier
              ) -> list[dict[str, Any]]:
  """How the top-``k`` parameters move across checkpoints.

  Args:
    series: ``[(checkpoint, {path: diff_norm}), ...]`` in checkpoint order (or a dict in
      insertion order).
    k: ranking depth.
    direct: optional "direct" description (see :func:`fp8jax.metrics.paths.as_predicate`).
    classifier: the paths' modules and layers (the model's
      :class:`~fp8jax.metrics.paths.Classifier`).

  Returns:
    One row per checkpoint: ``checkpoint``, ``k`` (effective), ``top`` (the top-k paths),
    ``topk_modules`` ({module: count}), ``overlap_prev`` / ``jaccard_prev`` /
    ``spearman_prev`` against the previous checkpoint and ``overlap_first`` /
    ``jaccard_first`` / ``spearman_first`` against the first (None on the first row), and
    ``direct_share`` (fraction of the top-k directly quantized) when ``direct`` is given.
  """
  items = list(series.items()) if isinstance(series, Mapping) else list(series)
  rows, first, prev = [], None, None
  for checkpoint, values in items:
    top = top_k(values, k)
    row: dict[str, Any] = {"checkpoint": checkpoint, "k": len(top), "top": top,
                           "topk_modules": module_counts(top, classifier)}
    for name, ref in (("prev", prev), ("first", first)):
      if ref is None:
        row.update({f"overlap_{name}": None, f"jaccard_{name}": None,
                    f"spearman_{name}": None})
      else:
        ref_top, ref_values = ref
        row.update({f"overlap_{name}": topk_overlap(top, ref_top, k),
                    f"jaccard_{name}": jaccard(top, ref_top),
                    f"spearman_{name}": spearman_params(values, ref_values)})
    if direct is not None:
      row["direct_share"] = direct_share_topk(values, k, direct, classifier)
    rows.append(row)
    prev = (top, values)
    first = first or prev
  return rows
