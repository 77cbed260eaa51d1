"""XLA references of the grouped blockwise-scaled GEMM kernels
(:mod:`fp8jax.kernels.grouped_scaled_pallas`).

The same arguments and the same arithmetic as the kernels, as plain XLA loops over the
promotion intervals: each interval's payload products (bfloat16 operands, exact for 8-bit
payloads) summed by a float32-accumulating dot, then ``acc = acc + partial * (sa * sb)``
in float32 with the product rounded first (behind ``lax.optimization_barrier``). They
agree with the kernels to float32 rounding (the order of the sums inside an interval and
a possible FMA in the kernel's promotion). For tests and GPU checks:

* :func:`rows_reference`: the rows are zero-padded per group to whole tiles of ``tile``
  rows; per interval, each tile takes its group's ``[F, interval]`` weight slice
  (bfloat16, ``tiles * F * interval`` elements; never a whole weight per tile).
* :func:`wgrad_reference`: a scan over the (group, interval) pairs that the groups' rows
  touch (at most ``J + E``), each a masked ``[K, interval] x [F, interval]`` dot added to
  ``dw[g]``, in order of the rows.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def _bf16(x: jax.Array, size: int, axis: int) -> jax.Array:
  """Payload as bfloat16 (exact for 8-bit floats), zero-padded to ``size`` along ``axis``."""
  x = lax.optimization_barrier(x).astype(jnp.bfloat16)
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, pad)


def rows_reference(a, a_scale_inv, b, b_scale_inv, group_sizes, *, transpose_b: bool = False,
                   interval: int = 128, b_block_n: int = 128, tile: int = 128) -> jax.Array:
  """float32 [N, F]: :func:`grouped_scaled_pallas.grouped_scaled_matmul`'s result (same
  arguments; ``tile`` rows per tile of the XLA loop)."""
  n, k = a.shape
  e = b.shape[0]
  bt = b if transpose_b else jnp.swapaxes(b, 1, 2)  # [E, F, K]
  f = bt.shape[1]
  n_int = _cdiv(k, interval)
  sb = b_scale_inv.astype(jnp.float32)
  sb = sb if transpose_b else jnp.swapaxes(sb, 1, 2)  # [E, F blocks, J]
  sb = jnp.repeat(sb, b_block_n, axis=1)[:, :f]  # [E, F, J]
  sizes = group_sizes.astype(jnp.int32)
  n_tiles = _cdiv(n + e * (tile - 1), tile)
  padded = (sizes + tile - 1) // tile * tile
  group = jnp.repeat(jnp.arange(e), sizes, total_repeat_length=n)
  dest = (jnp.cumsum(padded) - padded)[group] + jnp.arange(n) - (jnp.cumsum(sizes) - sizes)[group]
  dest = jnp.where(jnp.arange(n) < jnp.sum(sizes), dest, n_tiles * tile)  # past the sum: out

  def tiles(v):  # [N, C] -> [tiles, tile, C], each group starting a new tile
    out = jnp.zeros((n_tiles * tile, v.shape[1]), v.dtype).at[dest].set(v, mode="drop")
    return out.reshape(n_tiles, tile, v.shape[1])

  a_t = tiles(_bf16(a, n_int * interval, 1))
  sa_t = tiles(a_scale_inv.astype(jnp.float32))
  tile_group = jnp.searchsorted(jnp.cumsum(padded), jnp.arange(n_tiles) * tile, side="right")
  tile_group = jnp.minimum(tile_group, e - 1)  # spare tiles hold zero rows
  bt = _bf16(bt, n_int * interval, 2)

  def step(j, acc):
    a_j = lax.dynamic_slice_in_dim(a_t, j * interval, interval, axis=2)
    b_j = jnp.take(lax.dynamic_slice_in_dim(bt, j * interval, interval, axis=2), tile_group,
                   axis=0)  # [tiles, F, interval]
    part = jnp.einsum("tmc,tfc->tmf", a_j, b_j, preferred_element_type=jnp.float32)
    s_a = lax.dynamic_index_in_dim(sa_t, j, axis=2, keepdims=False)  # [tiles, tile]
    s_b = lax.dynamic_index_in_dim(sb, j, axis=2, keepdims=False)[tile_group]  # [tiles, F]
    return acc + lax.optimization_barrier(part * (s_a[:, :, None] * s_b[:, None, :]))

  acc = lax.fori_loop(0, n_int, step, jnp.zeros((n_tiles, tile, f), jnp.float32))
  return jnp.take(acc.reshape(n_tiles * tile, f), dest, axis=0, mode="fill", fill_value=0)


def wgrad_reference(a, a_scale_inv, b, b_scale_inv, group_sizes, *,
                    interval: int = 128) -> jax.Array:
  """float32 [E, K, F]: :func:`grouped_scaled_pallas.grouped_scaled_wgrad`'s result (same
  arguments; any group sizes, aligned to the intervals or not)."""
  kd, n = a.shape
  fd, e = b.shape[0], group_sizes.shape[0]
  n_int = _cdiv(n, interval)
  a16, b16 = _bf16(a, n_int * interval, 1), _bf16(b, n_int * interval, 1)
  sa, sb = a_scale_inv.astype(jnp.float32), b_scale_inv.astype(jnp.float32)
  sizes = group_sizes.astype(jnp.int32)
  ends = jnp.cumsum(sizes)
  starts = ends - sizes
  first = starts // interval
  count = jnp.where(sizes > 0, (ends + interval - 1) // interval - first, 0)
  seg_ends = jnp.cumsum(count)
  seg = jnp.arange(n_int + e, dtype=jnp.int32)  # a static bound on the segments
  g = jnp.minimum(jnp.searchsorted(seg_ends, seg, side="right"), e - 1).astype(jnp.int32)
  live = seg < seg_ends[-1]
  jj = jnp.minimum(first[g] + seg - (seg_ends[g] - count[g]), n_int - 1)

  def step(dw, xs):
    g_s, j_s, live_s = xs
    r = j_s * interval + jnp.arange(interval)
    keep = (r >= starts[g_s]) & (r < ends[g_s]) & live_s
    a_s = jnp.where(keep, lax.dynamic_slice_in_dim(a16, j_s * interval, interval, axis=1), 0)
    b_s = jnp.where(keep, lax.dynamic_slice_in_dim(b16, j_s * interval, interval, axis=1), 0)
    part = jnp.einsum("kc,fc->kf", a_s, b_s, preferred_element_type=jnp.float32)
    scale = lax.dynamic_index_in_dim(sa, j_s, axis=1) * \
        lax.dynamic_index_in_dim(sb, j_s, axis=1).T  # [K, 1] * [1, F]
    cur = lax.dynamic_index_in_dim(dw, g_s, axis=0, keepdims=False)
    new = jnp.where(live_s, cur + lax.optimization_barrier(part * scale), cur)
    return lax.dynamic_update_index_in_dim(dw, new, g_s, axis=0), None

  dw, _ = lax.scan(step, jnp.zeros((e, kd, fd), jnp.float32), (g, jj, live))
  return dw


__all__ = ["rows_reference", "wgrad_reference"]
