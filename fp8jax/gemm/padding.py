"""Rows sorted by group with every group zero-padded to a multiple of rows.

A Wgrad whose operands are quantized in tiles along the tokens (DeepSeek-V3's 1 x 128 tiles
of X^T and dY^T, MX blocks, Hadamard blocks) pads each expert's group to whole tiles, so
that no tile spans two experts, as when each expert's GEMM runs on its own rows. The
layout: group g starts at row ``sum_{h<g} ceil(size_h / m) * m``, its rows follow in order,
zero rows fill it up to the next multiple ``m``, and rows past the last group are zeros.
"""

from __future__ import annotations

import dataclasses

import jax
from jax import lax
import jax.numpy as jnp


def padded_count(n: int, groups: int, multiple: int) -> int:
  """Static row count of the padded layout of ``n`` rows in ``groups`` groups:
  ``n + groups * (multiple - 1)`` rounded up to the multiple."""
  return -(-(n + groups * (multiple - 1)) // multiple) * multiple


def padded_sizes(sizes: jax.Array, multiple: int) -> jax.Array:
  """int32 [E]: each group size rounded up to the multiple."""
  return (sizes + multiple - 1) // multiple * multiple


def group_layout(sizes: jax.Array, n: int, multiple: int):
  """Where each of N rows sorted by group goes in the padded layout.

  Args:
    sizes: int32 [E] rows per group, summing to at most ``n``.
    n: rows.
    multiple: the row multiple.

  Returns:
    ``(dest int32 [N], padded int32 [E], n_pad)``: the padded row of every row
    (``n_pad``, out of range, for rows past ``sum(sizes)``), the padded group sizes, and
    the static number of padded rows (:func:`padded_count`).
  """
  e = sizes.shape[0]
  n_pad = padded_count(n, e, multiple)
  padded = padded_sizes(sizes, multiple)
  pad_start = jnp.cumsum(padded) - padded
  start = jnp.cumsum(sizes) - sizes
  group = jnp.repeat(jnp.arange(e), sizes, total_repeat_length=n)
  dest = pad_start[group] + jnp.arange(n) - start[group]
  return jnp.where(jnp.arange(n) < jnp.sum(sizes), dest, n_pad), padded, n_pad


def padded_rows(sizes: jax.Array, n: int, n_pad: int, multiple: int):
  """Where each row of the padded layout comes from.

  Args:
    sizes: int32 [E] rows per group (unpadded), summing to at most ``n``.
    n: rows of the unpadded layout.
    n_pad: rows of the padded layout (at least :func:`padded_count`).
    multiple: the row multiple.

  Returns:
    ``(source int32 [n_pad], real bool [n_pad])``: the row of the unpadded sorted layout
    that each padded row holds (``n``, out of range, for padding rows) and whether it
    holds one.
  """
  padded = padded_sizes(sizes, multiple)
  pad_end = jnp.cumsum(padded)
  row = jnp.arange(n_pad, dtype=jnp.int32)
  group = jnp.minimum(jnp.searchsorted(pad_end, row, side="right"), sizes.shape[0] - 1)
  offset = row - (pad_end - padded)[group]
  real = offset < sizes[group]
  source = jnp.where(real, (jnp.cumsum(sizes) - sizes)[group] + offset, n)
  return source.astype(jnp.int32), real


def pad_groups(x: jax.Array, sizes: jax.Array, multiple: int):
  """Rows sorted by group, each group zero-padded to a multiple of ``multiple`` rows.

  A row gather behind optimization barriers (indices and rows): fused into their
  consumers, XLA recomputes the indices per element and gathers along the tokens inside
  the transposed quantization, far slower than the copy
  (docs/performance/archive/2026-11-24_gemm_pair_within_2x.md). A dispatch that lays the
  rows out padded in the first place (``fp8_ragged_dot``'s ``group_multiple``) needs no
  copy at all.

  Args:
    x: [N, C] rows sorted by group (rows past ``sum(sizes)`` are dropped).
    sizes: int32 [E].
    multiple: the row multiple.

  Returns:
    ``(x_pad [padded_count(N, E, multiple), C], padded_sizes [E])``.
  """
  n_pad = padded_count(x.shape[0], sizes.shape[0], multiple)
  if x.shape[0] == 0:
    return jnp.zeros((n_pad, *x.shape[1:]), x.dtype), padded_sizes(sizes, multiple)
  source, _ = padded_rows(sizes, x.shape[0], n_pad, multiple)
  source = lax.optimization_barrier(source)
  rows = jnp.take(x, source, axis=0, mode="fill", fill_value=0)
  return lax.optimization_barrier(rows), padded_sizes(sizes, multiple)


def mask_padding_scales(qt, valid: jax.Array):
  """``qt`` [N_pad, C] (a QTensor) with the scale_inv of blocks holding padding rows only
  set to the smallest normal float32, which no real scale_inv is below: a scaling-aware
  transpose then takes each new block's scale from its real rows, as on the unpadded
  group. ``valid``: bool [N_pad], the real rows."""
  rb = qt.full_block[-2]
  real = jax.ops.segment_max(valid.astype(jnp.int32), jnp.arange(valid.shape[0]) // rb,
                             num_segments=qt.scale_inv.shape[-2]) > 0
  scale_inv = jnp.where(real[:, None], qt.scale_inv.astype(jnp.float32),
                        jnp.finfo(jnp.float32).tiny)
  return dataclasses.replace(qt, scale_inv=scale_inv)
