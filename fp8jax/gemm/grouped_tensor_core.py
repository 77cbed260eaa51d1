"""Tensor-core accumulation in the grouped GEMM (:mod:`fp8jax.gemm.grouped`).

The tensor-core model of :mod:`fp8jax.gemm.accumulate` applied per group (expert), so that
each group's part of the result equals the dense simulation of that group's GEMM
(``fp8_dot_general`` on the group's rows) bit for bit, given the same quantized operands:

* Rows, :func:`rows_product` (Fprop ``Y = X . W_g``, Dgrad ``dX = dY . W_g^T``): the rows,
  sorted by group, are zero-padded per group to whole tiles of ``tile`` rows, every tile
  takes its group's weight, and :func:`accumulate.tensor_core_products` runs with the
  tiles as its batch. The model treats every (row, column) on its own, so the tiling
  changes no bit.
* Wgrad, :func:`wgrad_product` (``dW_g = X_g^T . dY_g``, a contraction over the group's
  rows): the operands come in the padded layout of :mod:`fp8jax.gemm.padding`, each group
  starting at a multiple of the promotion interval. A scan over blocks of ``block_size``
  rows runs the accumulator and, at the end of each interval, promotes it into ``dW[g]``
  in float32, in order of the rows: the dense model of one group whose K is its rows
  (zero rows of padding add zero products and zero promotions).

Memory: the rows product holds one weight per tile (float32 [tiles, F, K], tiles at most
``(N + E * (tile - 1)) / tile``) and ``[tiles, tile, F, block_size]`` products per step,
as the dense model does for that many rows; the Wgrad scan holds ``[K, F, block_size]``
products and dW [E, K, F].
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from fp8jax.gemm import accumulate
from fp8jax.gemm.padding import group_layout
from fp8jax.quant import qtensor


def _alpha(a_tensor, b_tensor, b_index):
  """The two-level (NVFP4) second levels as the GEMM's alpha, multiplied in the order of
  ``accumulate.scaled_matmul``, broadcastable to the output [rows, cols] (or [E, rows,
  cols]); None without them. ``a_tensor``: a scalar or per row [rows, 1] (row-scaled);
  ``b_tensor``: one operand's, a scalar or [cols, 1], or with ``b_index`` (each output
  row's group) per group, [E] or [E, cols, 1]."""
  if a_tensor is None and b_tensor is None:
    return None
  alpha = jnp.float32(1.0)
  if a_tensor is not None:
    alpha = alpha * a_tensor.astype(jnp.float32)
  if b_tensor is not None:
    b = b_tensor.astype(jnp.float32)
    if b_index is not None:
      b = b[b_index]
      b = b[:, None] if b.ndim == 1 else b[..., 0]
    elif b.ndim:
      b = jnp.swapaxes(b, -1, -2)
    alpha = alpha * b
  return alpha


def rows_product(aq: qtensor.QTensor, bq: qtensor.QTensor, sizes: jax.Array,
                 acc: accumulate.Accumulation, tile: int = 128) -> jax.Array:
  """``Y[n] = A[n] . Bt[g(n)]^T`` with the tensor-core model.

  Args:
    aq: quantized rows [N, K], sorted by group.
    bq: quantized per group [E, R, K] (a vmapped quantize: ``tensor_scale_inv`` None or
      [E]).
    sizes: int32 [E] rows per group, summing to at most N.
    acc: the tensor-core accumulator.
    tile: rows per tile.

  Returns:
    float32 [N, R]; rows past ``sum(sizes)`` are zero.
  """
  n, k = aq.shape
  e = bq.shape[0]
  interval = accumulate.tensor_core_interval(k, acc)
  a, sa = accumulate.tensor_core_operand(aq, interval)  # [N, K_pad], [N, J]
  b, sb = accumulate.tensor_core_operand(bq, interval)  # [E, R, K_pad], [E, R, J]
  dest, padded, n_pad = group_layout(sizes, n, tile)
  tiles = n_pad // tile

  def to_tiles(v):
    out = jnp.zeros((n_pad, v.shape[1]), v.dtype).at[dest].set(v, mode="drop")
    return out.reshape(tiles, tile, v.shape[1])

  tile_group = jnp.searchsorted(jnp.cumsum(padded), jnp.arange(tiles) * tile, side="right")
  tile_group = jnp.minimum(tile_group, e - 1)  # tiles past the groups hold zero rows
  y = accumulate.tensor_core_products(to_tiles(a), b[tile_group], to_tiles(sa),
                                      sb[tile_group], interval, acc)
  y = jnp.take(y.reshape(n_pad, -1), dest, axis=0, mode="fill", fill_value=0)
  row_group = jnp.minimum(jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(n), side="right"),
                          e - 1)
  alpha = _alpha(aq.tensor_scale_inv, bq.tensor_scale_inv, row_group)
  if alpha is None:
    return y
  return y * alpha


def wgrad_product(aq: qtensor.QTensor, bq: qtensor.QTensor, padded: jax.Array,
                  acc: accumulate.Accumulation) -> jax.Array:
  """``dW[g] = A_g . B_g^T`` over the rows of each group, with the tensor-core model.

  Args:
    aq: quantized [K, N_pad] (X^T): the groups' rows in the padded layout of
      :mod:`fp8jax.gemm.padding`, zero rows between the groups and after the last.
    bq: quantized [F, N_pad] (dY^T), the same layout.
    padded: int32 [E] padded group sizes: multiples of the promotion interval (of
      ``acc.block_size`` when it never promotes); N_pad is a multiple of them too.
    acc: the tensor-core accumulator.

  Returns:
    float32 [E, K, F]; zero for empty groups.

  Raises:
    ValueError: when an interval straddles two scale blocks along the rows, or when
      ``acc`` never promotes and the scales change along the rows.
  """
  e = padded.shape[0]
  n_pad = aq.shape[-1]
  bs, interval = acc.block_size, acc.promotion_interval
  if interval is None and any(min(q.full_block[-1], n_pad) < n_pad for q in (aq, bq)):
    raise ValueError("a tensor-core accumulator that never promotes needs Wgrad scales "
                     "constant along the tokens (per-tensor or per-channel)")
  a, sa = accumulate.tensor_core_operand(aq, interval or bs)  # [K, N_pad], [K, J]
  b, sb = accumulate.tensor_core_operand(bq, interval or bs)  # [F, N_pad], [F, J]
  if a.shape[-1] != n_pad:
    raise ValueError(f"{n_pad} padded rows are not whole intervals of {interval}")
  steps = n_pad // bs
  per_interval = (interval or bs) // bs
  blocks = lambda v: jnp.moveaxis(v.reshape(v.shape[0], steps, bs), 1, 0)  # noqa: E731
  block_scales = lambda s: jnp.moveaxis(s, -1, 0)[np.arange(steps) // per_interval]  # noqa: E731
  ends = jnp.cumsum(padded)
  row0 = jnp.arange(steps) * bs
  group = jnp.searchsorted(ends, row0, side="right")  # E past the last group
  g = jnp.minimum(group, e - 1)
  offset = row0 + bs - (ends[g] - padded[g])  # rows of the group up to the block's end
  end = offset == padded[g]
  if interval is not None:
    end = end | (offset % interval == 0)
  live = group < e

  def step(carry, xs):
    acc_tc, dw = carry
    a_t, b_t, sa_t, sb_t, g_t, end_t, live_t = xs
    prods = a_t[:, None, :] * b_t[None, :, :]  # [K, F, bs], exact
    terms = jnp.concatenate([acc_tc[..., None], prods], axis=-1)
    acc_tc = accumulate.aligned_block_sum(terms, acc.fraction_bits)
    cur = lax.dynamic_index_in_dim(dw, g_t, axis=0, keepdims=False)
    # Round the product before the add, as the dense model does.
    promoted = cur + lax.optimization_barrier(acc_tc * (sa_t[:, None] * sb_t[None, :]))
    dw = lax.dynamic_update_index_in_dim(dw, jnp.where(end_t & live_t, promoted, cur), g_t, 0)
    acc_tc = jnp.where(end_t | ~live_t, jnp.zeros_like(acc_tc), acc_tc)
    return (acc_tc, dw), None

  init = (jnp.zeros((a.shape[0], b.shape[0]), jnp.float32),
          jnp.zeros((e, a.shape[0], b.shape[0]), jnp.float32))
  xs = (blocks(a), blocks(b), block_scales(sa), block_scales(sb), g, end, live)
  (_, dw), _ = lax.scan(step, init, xs)
  alpha = _alpha(aq.tensor_scale_inv, bq.tensor_scale_inv, None)
  return dw if alpha is None else dw * alpha
