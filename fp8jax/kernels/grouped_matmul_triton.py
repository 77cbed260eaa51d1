"""Pallas (GPU Triton backend) grouped GEMM for MoE experts, forward and backward.

``grouped_matmul(x, w, group_sizes)`` computes ``y[n] = x[n] @ w[g(n)]`` for rows ``x``
[N, d] sorted by group (expert) and stacked weights ``w`` [E, d, f]: the same function as
:func:`fp8jax.gemm.grouped.padded_grouped_matmul`, without copying any weight. Every program
reads its expert's weight in place:

* Forward and Dgrad: the rows are cut into tiles of ``block_m`` rows that never cross a
  group boundary (a group's last tile is partial and masked), so there are at most
  ``ceil(N / block_m) + E + 1`` row tiles (a static bound; spare tiles exit at once).
  Program ``(t, j)`` loads tile ``t``'s group id and row range, then loops over the
  contraction in steps of ``block_k``, loading ``x`` rows and its expert's
  ``w[g, k, j-block]`` (Dgrad: ``w[g, j-block, k]`` transposed in the dot) and
  accumulating in float32. Rows past ``sum(group_sizes)`` form one more range whose
  output is written as zeros.
* Wgrad ``dw[g] = x_g^T dy_g``: program ``(g, i, j)`` loops over its group's rows in
  steps of ``block_k`` (a trip count read at run time) and writes one
  ``[block_m, block_n]`` block of ``dw[g]``; an empty group writes zeros.

Operands are multiplied in their own dtype (bf16 on the tensor cores) with float32
accumulation; outputs are cast to the operands' dtype. Partial blocks along d and f are
masked, so no dimension needs padding. Pallas is imported when a kernel is called; on CPU
pass ``interpret=True`` (the tests do).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Block shape and Triton launch parameters of one kernel (static, hashable)."""

  m: int = 128
  n: int = 128
  k: int = 64
  num_warps: int = 8
  num_stages: int = 3

  def __post_init__(self):
    for name in ("m", "n", "k"):
      v = getattr(self, name)
      if v < 16 or v & (v - 1):
        raise ValueError(f"block {name} must be a power of two >= 16, got {v}")


# The fastest of the shapes swept at the 2B shapes on Hopper (scripts/bench/grouped_gemm.py;
# docs/performance/archive/2026-11-21_second_pass_pallas.md, target 2).
FORWARD = Blocks(m=128, n=256, k=64, num_warps=8, num_stages=4)
WGRAD = Blocks(m=256, n=128, k=64, num_warps=8, num_stages=3)


def row_tiles(group_sizes: jax.Array, n_rows: int, block_m: int):
  """Row tiles that never cross a group boundary.

  Args:
    group_sizes: int32 [E], summing to at most ``n_rows``.
    n_rows: N, the number of rows.
    block_m: rows per tile.

  Returns:
    ``(group, start, end)``, int32 [T] each with ``T = ceil(N / block_m) + E + 1``:
    tile ``t`` covers rows ``start[t] <= r < end[t]`` of group ``group[t]``; group ``E``
    marks the rows past ``sum(group_sizes)`` (output zeros) and spare tiles have
    ``start == end``.
  """
  e = group_sizes.shape[0]
  sizes = jnp.concatenate([group_sizes.astype(jnp.int32),
                           (n_rows - jnp.sum(group_sizes, dtype=jnp.int32))[None]])
  ends = jnp.cumsum(sizes)
  starts = ends - sizes
  tiles = (sizes + block_m - 1) // block_m
  tile_ends = jnp.cumsum(tiles)
  n_tiles = -(-n_rows // block_m) + e + 1
  t = jnp.arange(n_tiles, dtype=jnp.int32)
  group = jnp.minimum(jnp.searchsorted(tile_ends, t, side="right"), e).astype(jnp.int32)
  local = t - (tile_ends[group] - tiles[group])
  start = starts[group] + local * block_m
  end = jnp.minimum(start + block_m, ends[group])
  used = t < tile_ends[-1]
  return group, jnp.where(used, start, 0), jnp.where(used, end, 0)


def _params(blocks: Blocks, interpret: bool):
  if interpret:
    return None
  from jax.experimental.pallas import triton as plgpu
  return plgpu.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages)


def _rows_kernel(group_ref, start_ref, end_ref, x_ref, w_ref, o_ref, *, blocks: Blocks,
                 transpose_w: bool):
  """Program (t, j): o[start:end, j-block] = x[start:end] @ w[group] (or w[group]^T)."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu

  t, j = pl.program_id(0), pl.program_id(1)
  g, start, end = group_ref[t], start_ref[t], end_ref[t]
  bm, bn, bk = blocks.m, blocks.n, blocks.k
  n_out, depth = o_ref.shape[1], x_ref.shape[1]
  e = w_ref.shape[0]
  rows = start + lax.broadcasted_iota(jnp.int32, (bm, 1), 0)
  cols = j * bn + lax.broadcasted_iota(jnp.int32, (1, bn), 1)
  row_ok, col_ok = rows < end, cols < n_out

  @pl.when(end > start)
  def _():
    def body(kk, acc):
      ks = kk * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
      a = plgpu.load(x_ref.at[pl.ds(start, bm), pl.ds(kk * bk, bk)],
                     mask=row_ok & (ks < depth), other=0)
      if transpose_w:  # w[g] is [f_out, depth]: load [bn, bk] and contract its last axis
        b = plgpu.load(w_ref.at[g, pl.ds(j * bn, bn), pl.ds(kk * bk, bk)],
                       mask=col_ok.reshape(bn, 1) & (ks < depth), other=0)
        prod = lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32)
      else:  # w[g] is [depth, f_out]: load [bk, bn]
        b = plgpu.load(w_ref.at[g, pl.ds(kk * bk, bk), pl.ds(j * bn, bn)],
                       mask=(ks.reshape(bk, 1) < depth) & col_ok, other=0)
        prod = jnp.dot(a, b, preferred_element_type=jnp.float32)
      return acc + prod

    zero = jnp.zeros((bm, bn), jnp.float32)
    steps = jnp.int32(pl.cdiv(depth, bk)) * (g < e).astype(jnp.int32)  # group e: zeros
    acc = lax.fori_loop(jnp.int32(0), steps, body, zero)
    plgpu.store(o_ref.at[pl.ds(start, bm), pl.ds(j * bn, bn)], acc.astype(o_ref.dtype),
                mask=row_ok & col_ok)


def _wgrad_kernel(start_ref, end_ref, x_ref, dy_ref, o_ref, *, blocks: Blocks):
  """Program (g, i, j): dw[g, i-block, j-block] = x[group g rows, i-block]^T dy[..., j-block]."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu

  g, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  start, end = start_ref[g], end_ref[g]
  bm, bn, bk = blocks.m, blocks.n, blocks.k
  d, f = o_ref.shape[1], o_ref.shape[2]
  di = i * bm + lax.broadcasted_iota(jnp.int32, (1, bm), 1)
  fj = j * bn + lax.broadcasted_iota(jnp.int32, (1, bn), 1)
  di_ok, fj_ok = di < d, fj < f

  def body(kk, acc):
    r0 = start + kk * bk
    row_ok = (r0 + lax.broadcasted_iota(jnp.int32, (bk, 1), 0)) < end
    a = plgpu.load(x_ref.at[pl.ds(r0, bk), pl.ds(i * bm, bm)], mask=row_ok & di_ok, other=0)
    b = plgpu.load(dy_ref.at[pl.ds(r0, bk), pl.ds(j * bn, bn)], mask=row_ok & fj_ok, other=0)
    return acc + lax.dot_general(a, b, (((0,), (0,)), ((), ())),
                                 preferred_element_type=jnp.float32)

  steps = lax.div(end - start + jnp.int32(bk - 1), jnp.int32(bk))  # sizes are >= 0
  acc = lax.fori_loop(jnp.int32(0), steps, body, jnp.zeros((bm, bn), jnp.float32))
  plgpu.store(o_ref.at[g, pl.ds(i * bm, bm), pl.ds(j * bn, bn)], acc.astype(o_ref.dtype),
              mask=di_ok.reshape(bm, 1) & fj_ok)


def _check(x, w, group_sizes, transpose_w=False):
  if x.ndim != 2 or w.ndim != 3 or group_sizes.shape != (w.shape[0],):
    raise ValueError(f"grouped_matmul needs x [N, d], w [E, d, f] and group_sizes [E]; got "
                     f"{x.shape}, {w.shape} and {group_sizes.shape}")
  depth = w.shape[2] if transpose_w else w.shape[1]
  if x.shape[1] != depth:
    raise ValueError(f"x's last axis ({x.shape[1]}) does not match the weights' contraction "
                     f"axis ({depth}) for w of shape {w.shape}")
  if x.dtype != w.dtype:
    raise TypeError(f"x and w must share a dtype, got {x.dtype} and {w.dtype}")


def rows_matmul(x, w, group_sizes, *, transpose_w: bool = False, blocks: Blocks = FORWARD,
                interpret: bool = False):
  """``x[n] @ w[g(n)]`` (``w[g(n)]^T`` with ``transpose_w``): [N, f] in x's dtype."""
  from jax.experimental import pallas as pl

  _check(x, w, group_sizes, transpose_w)
  n = x.shape[0]
  f = w.shape[1] if transpose_w else w.shape[2]
  if n == 0 or f == 0:
    return jnp.zeros((n, f), x.dtype)
  group, start, end = row_tiles(group_sizes, n, blocks.m)
  return pl.pallas_call(
      functools.partial(_rows_kernel, blocks=blocks, transpose_w=transpose_w),
      out_shape=jax.ShapeDtypeStruct((n, f), x.dtype),
      grid=(group.shape[0], pl.cdiv(f, blocks.n)),
      compiler_params=_params(blocks, interpret),
      interpret=interpret,
      name="fp8jax_grouped_dgrad" if transpose_w else "fp8jax_grouped_fprop",
  )(group, start, end, x, w)


def wgrad(x, dy, group_sizes, *, blocks: Blocks = WGRAD, interpret: bool = False):
  """``dw[g] = x_g^T dy_g`` for every group: [E, d, f] in x's dtype (zeros for empty
  groups; rows past ``sum(group_sizes)`` are ignored)."""
  from jax.experimental import pallas as pl

  if x.ndim != 2 or dy.ndim != 2 or x.shape[0] != dy.shape[0]:
    raise ValueError(f"wgrad needs x [N, d] and dy [N, f]; got {x.shape} and {dy.shape}")
  e = group_sizes.shape[0]
  d, f = x.shape[1], dy.shape[1]
  if x.shape[0] == 0 or d == 0 or f == 0:
    return jnp.zeros((e, d, f), x.dtype)
  ends = jnp.cumsum(group_sizes.astype(jnp.int32))
  starts = ends - group_sizes.astype(jnp.int32)
  return pl.pallas_call(
      functools.partial(_wgrad_kernel, blocks=blocks),
      out_shape=jax.ShapeDtypeStruct((e, d, f), x.dtype),
      grid=(e, pl.cdiv(d, blocks.m), pl.cdiv(f, blocks.n)),
      compiler_params=_params(blocks, interpret),
      interpret=interpret,
      name="fp8jax_grouped_wgrad",
  )(starts, ends, x, dy.astype(x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _grouped(x, w, group_sizes, fwd_blocks, wgrad_blocks, interpret):
  return rows_matmul(x, w, group_sizes, blocks=fwd_blocks, interpret=interpret)


def _grouped_fwd(x, w, group_sizes, fwd_blocks, wgrad_blocks, interpret):
  y = rows_matmul(x, w, group_sizes, blocks=fwd_blocks, interpret=interpret)
  return y, (x, w, group_sizes)


def _grouped_bwd(fwd_blocks, wgrad_blocks, interpret, res, dy):
  x, w, group_sizes = res
  dy = dy.astype(x.dtype)
  dx = rows_matmul(dy, w, group_sizes, transpose_w=True, blocks=fwd_blocks,
                   interpret=interpret)
  dw = wgrad(x, dy, group_sizes, blocks=wgrad_blocks, interpret=interpret)
  return dx, dw.astype(w.dtype), None


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *,
                   fwd_blocks: Blocks = FORWARD, wgrad_blocks: Blocks = WGRAD,
                   interpret: bool | None = None) -> jax.Array:
  """Differentiable grouped GEMM: ``y[n] = x[n] @ w[g(n)]``.

  Args:
    x: [N, d] rows sorted by group (bf16 for the tensor cores; any float dtype).
    w: [E, d, f] one weight per group, x's dtype.
    group_sizes: int32 [E] summing to at most N; rows past the sum give zeros (and no
      gradient).
    fwd_blocks: blocks of the forward and Dgrad kernels.
    wgrad_blocks: blocks of the Wgrad kernel.
    interpret: run with the Pallas interpreter (None: unless the default backend is a GPU).

  Returns:
    [N, f] in x's dtype.
  """
  _check(x, w, group_sizes)
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  return _grouped(x, w, group_sizes.astype(jnp.int32), fwd_blocks, wgrad_blocks, interpret)


__all__ = ["Blocks", "grouped_matmul", "row_tiles", "rows_matmul", "wgrad"]
