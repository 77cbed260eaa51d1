"""Timing and output checks shared by the benchmark scripts.

``median_time`` is the one timing method of ``scripts/bench``: after ``warmup`` calls,
each of ``runs`` timed runs makes ``calls`` back-to-back calls (rotating through
``args_list``), keeps their outputs alive and synchronises once with
``jax.block_until_ready``; the time per call of a run is its wall time / ``calls``.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp


def median_time(fn, args_list, runs: int, calls: int = 1, warmup: int = 2
                ) -> tuple[float, list[float]]:
  """(median seconds per call over the runs, the per-call seconds of every run)."""
  for i in range(warmup):
    jax.block_until_ready(fn(*args_list[i % len(args_list)]))
  times = []
  for r in range(runs):
    t = time.perf_counter()
    outs = [fn(*args_list[(r * calls + i) % len(args_list)]) for i in range(calls)]
    jax.block_until_ready(outs)
    times.append((time.perf_counter() - t) / calls)
    del outs
  return statistics.median(times), times


def poisoned(fn, *args):
  """``fn(*args)`` computed right after freeing a NaN-filled buffer of its output's size,
  which the allocator hands out again: a NaN in the output (of finite inputs) means an
  element was never written."""
  leaves = jax.tree_util.tree_leaves(jax.eval_shape(fn, *args))
  poison = [jnp.full(s.shape, jnp.nan, s.dtype) for s in leaves]
  jax.block_until_ready(poison)
  del poison
  return jax.block_until_ready(fn(*args))


def count_nans(tree) -> int:
  """The number of NaN elements over the leaves of ``tree``."""
  return int(sum(int(jnp.sum(jnp.isnan(x))) for x in jax.tree_util.tree_leaves(tree)))
