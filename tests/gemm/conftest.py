"""Shared operands of the grouped-GEMM tests (``test_grouped``, ``test_grouped_tensor_core``):
rows sorted by expert, per-expert weights and a cotangent; the test modules import
:func:`ragged_case` and :func:`nonempty_experts`."""

import jax.numpy as jnp
import numpy as np


def ragged_case(sizes=(128, 0, 256), k=256, f=128, seed=0):
  """``(x [N, k], w [E, k, f], dy [N, f], sizes int32 [E])``, N = sum(sizes)."""
  rng = np.random.default_rng(seed)
  n = sum(sizes)
  x = jnp.asarray(rng.standard_normal((n, k)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((len(sizes), k, f)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((n, f)) * 1e-2, jnp.float32)
  return x, w, dy, jnp.asarray(sizes, jnp.int32)


def nonempty_experts(sizes, dw):
  """``(e, rows)`` of each expert with rows (its slice of the sorted rows), after checking
  that every expert without rows has an all-zero weight gradient ``dw[e]``."""
  start = 0
  for e, size in enumerate(np.asarray(sizes)):
    rows = slice(start, start + size)
    start += size
    if size == 0:
      np.testing.assert_array_equal(dw[e], 0)
    else:
      yield e, rows
