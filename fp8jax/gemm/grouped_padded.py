"""A grouped GEMM in plain XLA with static shapes (rows sorted by group, one weight per
group): the reference and CPU path of the MoE experts' GEMMs."""

from __future__ import annotations

import jax.numpy as jnp


def padded_grouped_matmul(x, w, group_sizes, tile: int = 128, out_dtype=None):
  """Grouped GEMM with static shapes: each group is padded to whole tiles of ``tile``
  rows, every tile takes its group's weight, and one batched matmul runs over the tiles.

  Rows: at most ``N + E * (tile - 1)`` after padding (a static bound), so the work is at
  most that over N times the ideal, and nothing is dropped.

  Args:
    x: [N, d] rows sorted by group.
    w: [E, d, f].
    group_sizes: int32 [E] summing to at most N; rows past the sum give zeros.

  Returns:
    [N, f] in ``out_dtype`` (default x's dtype).
  """
  n, d = x.shape
  e = w.shape[0]
  n_tiles = -(-(n + e * (tile - 1)) // tile)
  padded = (group_sizes + tile - 1) // tile * tile
  pad_start = jnp.cumsum(padded) - padded
  start = jnp.cumsum(group_sizes) - group_sizes
  group = jnp.repeat(jnp.arange(e), group_sizes, total_repeat_length=n)
  dest = pad_start[group] + jnp.arange(n) - start[group]
  valid = (jnp.arange(n) < jnp.sum(group_sizes))[:, None]
  x_pad = jnp.zeros((n_tiles * tile, d), x.dtype).at[dest].set(jnp.where(valid, x, 0))
  tile_group = jnp.searchsorted(jnp.cumsum(padded), jnp.arange(n_tiles) * tile, side="right")
  w_tiles = jnp.take(w, jnp.minimum(tile_group, e - 1), axis=0)
  y = jnp.einsum("tmd,tdf->tmf", x_pad.reshape(n_tiles, tile, d), w_tiles,
                 preferred_element_type=jnp.float32)
  y = jnp.where(valid, y.reshape(n_tiles * tile, -1)[dest], 0)
  return y.astype(out_dtype or x.dtype)
