"""Per-block reductions and broadcasts for any block shape.

A *block shape* has one entry per axis (see ``Granularity.block_shape``). Shapes that
are not divisible by the block are padded with zeros for the amax, which can never
raise a magnitude maximum, and the padding is cut off again after broadcasting, so it
never changes a value.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np


def num_blocks(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
  """Blocks per axis: ``ceil(shape / block)``."""
  return tuple(math.ceil(d / b) for d, b in zip(shape, block))


def align_block(block: tuple[int, ...], rank: int) -> tuple[int, ...]:
  """Aligns a block shape to the trailing axes of a rank-``rank`` tensor.

  Leading axes that the block does not name get block size 1, which is what a
  granularity computed inside ``jax.vmap`` means for the batched array.
  """
  if len(block) > rank:
    raise ValueError(f"block shape {block} has more axes than the tensor (rank {rank})")
  return (1,) * (rank - len(block)) + tuple(block)


def finite_abs(x: jnp.ndarray) -> jnp.ndarray:
  """|x| in float32 with NaN, ±inf and float32 subnormals replaced by 0 (they never enter
  an amax). Subnormals are dropped explicitly: XLA:CPU flushes them to zero in arithmetic
  but not always in abs/max, and GPUs keep them, so a block holding only subnormals would
  otherwise get a scale that depends on the platform and the fusion (found by the MX
  property tests: 2**-126 instead of the all-zero block's 1)."""
  a = jnp.abs(x.astype(jnp.float32))
  return jnp.where(jnp.isfinite(a) & (a >= np.float32(np.finfo(np.float32).tiny)), a, 0.0)


def amax_abs(x: jnp.ndarray) -> jnp.ndarray:
  """|x| as it enters a block amax: float32, float32 subnormals 0 (as in
  :func:`finite_abs`), NaN and ±inf +inf, so that a block holding a non-finite value has
  amax +inf and its scale marks it (``fp8jax.numerics.scales``). The one reduction then
  carries both facts, also where max drops NaN (Triton)."""
  a = jnp.abs(x.astype(jnp.float32))
  small = a < np.float32(np.finfo(np.float32).tiny)
  return jnp.where(jnp.isfinite(a), jnp.where(small, 0.0, a), np.float32(np.inf))


def split_blocks(x: jnp.ndarray, block: tuple[int, ...]):
  """``x`` zero-padded to whole blocks and reshaped ``[n0, b0, n1, b1, ...]``: (that
  array, the block axes ``(1, 3, ...)``, the padded shape)."""
  shape = tuple(x.shape)
  counts = num_blocks(shape, block)
  padded = tuple(n * b for n, b in zip(counts, block))
  if padded != shape:
    x = jnp.pad(x, [(0, p - d) for d, p in zip(shape, padded)])
  split = [v for n, b in zip(counts, block) for v in (n, b)]
  return x.reshape(split), tuple(range(1, 2 * len(shape), 2)), padded


def block_amax(x: jnp.ndarray, block: tuple[int, ...]) -> jnp.ndarray:
  """Largest |x| of every block (:func:`amax_abs`: +inf for a block holding NaN or ±inf).

  Args:
    x: array of shape ``S``.
    block: block shape, one entry per axis of ``x``.

  Returns:
    float32 array of shape ``num_blocks(S, block)``.
  """
  a, axes = _blocked(amax_abs(x), block)
  return jnp.max(a, axis=axes, initial=0.0)


def broadcast_blocks(values: jnp.ndarray, block: tuple[int, ...],
                     shape: tuple[int, ...]) -> jnp.ndarray:
  """Expands per-block ``values`` to a full array of ``shape``.

  Args:
    values: array of shape ``num_blocks(shape, block)``.
    block: block shape, one entry per axis.
    shape: target shape.

  Returns:
    Array of ``shape`` where every element holds the value of its block.
  """
  counts = values.shape
  split = [v for n, b in zip(counts, block) for v in (n, b)]
  expanded = jnp.broadcast_to(
      values.reshape([v for n in counts for v in (n, 1)]), split)
  full = expanded.reshape([n * b for n, b in zip(counts, block)])
  if full.shape != tuple(shape):
    full = full[tuple(slice(0, d) for d in shape)]
  return full


def _blocked(x: jnp.ndarray, block: tuple[int, ...]) -> tuple[jnp.ndarray, tuple[int, ...]]:
  """``x`` zero-padded to whole blocks and reshaped to ``[n_0, b_0, n_1, b_1, ...]``, with
  the axes to reduce over for per-block values."""
  counts = num_blocks(x.shape, block)
  pad = [(0, n * b - d) for d, b, n in zip(x.shape, block, counts)]
  if any(hi for _, hi in pad):
    x = jnp.pad(x, pad)
  split = [v for n, b in zip(counts, block) for v in (n, b)]
  return x.reshape(split), tuple(range(1, 2 * len(block), 2))


def block_sum(x: jnp.ndarray, block: tuple[int, ...]) -> jnp.ndarray:
  """Sum of every block of ``x`` in float32 (the padding adds zeros): shape
  ``num_blocks(S, block)``."""
  xb, axes = _blocked(x.astype(jnp.float32), block)
  return jnp.sum(xb, axis=axes)
