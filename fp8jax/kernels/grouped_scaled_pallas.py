"""Pallas (GPU Triton backend) grouped GEMM with blockwise FP8 scales, FP32 promotion.

The MoE experts' GEMMs of ``gemm:fp32_blockwise`` (DeepSeek-V3: FP8 operands, 1x128 tiles
for rows, 128x128 blocks for weights, FP32 promotion every 128 elements of the contraction)
with the scales applied per promotion interval inside the kernel. Every program reads its
expert's payload tiles and scales in place: there is no weight copy per row tile (the
XLA simulation, ``fp8jax.gemm.grouped.padded_grouped_matmul``, gathers a float32 weight per tile).

* :func:`grouped_scaled_matmul` (Fprop ``Y = X W_g``, Dgrad ``dX = dY W_g^T``): rows
  ``a`` [N, K] sorted by group, ``y[n] = sum_j (a[n, I_j] . b[g(n)][I_j, :]) *
  sa[n, j] * sb[g(n), j, :]``. Row tiles never cross a group boundary
  (:func:`grouped_matmul_triton.row_tiles`); program ``(c, t)`` walks K in intervals.
* :func:`grouped_scaled_wgrad` (Wgrad ``dW_g = X_g^T dY_g``): the contraction runs over
  the rows, both operands in contraction-last layout (X^T [K, N], dY^T [F, N]) or, with
  ``rows_first``, in the rows' layout the forward pass has (X [N, K], dY [N, F]: no
  transposed copies), with one scale per 128-row interval and per column. Program
  ``(c, i, g)`` walks the intervals that group ``g``'s rows touch, masking the rows of
  other groups: the rows may be unpadded (an interval shared by two groups has one scale
  for both, as in the XLA simulation) or each group padded to whole intervals
  (``pad_groups``; as real kernels do, no scale spans two experts), where
  ``groups_aligned=True`` drops the row masks.

Inside an interval, ``bf16 x bf16 -> float32`` dots of ``block.k`` elements (FP8 payloads
are exact in bfloat16: exact products, float32 sums in the tensor cores' order) chain in
one float32 accumulator; at its end ``acc = acc + partial * (sa[:, None] * sb[None, :])``
in float32 (Triton may fuse this into an FMA: at most one float32 ulp per promotion
against the XLA reference, which rounds the product first). Output float32 (or
``out_dtype``). Payloads are 8-bit floats or bfloat16; 8-bit ones are converted to
bfloat16 by XLA before the kernel (or in it: ``convert_in_kernel``), or, with ``fp8_dots``,
multiplied as they are on the FP8 tensor cores. Two-level (NVFP4)
per-tensor levels are not applied: multiply the output by them.

JAX has deprecated its Pallas Triton backend, but the project's GEMM kernels use it
(:mod:`scaled_matmul_pallas`, :mod:`grouped_matmul_triton`), and the Mosaic GPU grouped
kernels that JAX ships (:mod:`grouped_matmul_mosaic`) take no scales. Pallas is imported
when a kernel is called; on CPU pass ``interpret=True``. XLA references, for the tests and
the benchmark: ``tests/references/grouped_scaled_reference.py``.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.kernels import grouped_matmul_triton as gmp
from fp8jax.kernels import scaled_matmul_pallas as smp

Blocks = gmp.Blocks
ROWS = Blocks(m=64, n=128, k=128, num_warps=4, num_stages=4)
"""Fprop / Dgrad default, the fastest tile tried at the 2B shapes on Hopper for groups
aligned to whole row tiles (docs/performance/archive/2026-11-26_grouped_blockwise_fp8_dots.md,
raw data in its ``docs/perf_raw`` tarball)."""
WGRAD = Blocks(m=128, n=128, k=128, num_warps=8, num_stages=3)
"""Wgrad default: the fastest of the tiles tried on Hopper
(docs/performance/archive/2026-11-23_grouped_blockwise_kernel.md)."""
ROWS_FP8, WGRAD_FP8 = Blocks(64, 64, 128, 4, 4), Blocks(64, 128, 128, 4, 4)
"""The defaults with ``fp8_dots``, the fastest tried on Hopper at the 2B gate GEMM
(``grouped_scaled_variants.py mma``; each faster than ROWS or WGRAD with FP8 dots:
docs/performance/archive/2026-11-26_pair_one_pass_fp8_mma.md). Row tiles of 64, as ROWS,
for ``groups_aligned``."""


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def _and(*masks):
  """The conjunction of the masks that are not None (None: no mask at all)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0]
  for m in masks[1:]:
    out = out & m
  return out


def _chunk(interval: int, blocks: Blocks, payloads) -> int:
  """Elements of the contraction per dot; validates interval, blocks and payloads."""
  for p in payloads:
    if not smp.supports_payload(p.dtype):
      raise TypeError(f"payloads must be 8-bit floats or bfloat16, got {p.dtype}")
  if not smp.supports_interval(interval):
    raise ValueError(f"unsupported promotion interval {interval}: need a power of two "
                     "from 16 to 128 or a multiple of 128")
  chunk = min(interval, blocks.k)
  if interval % chunk:
    raise ValueError(f"block k ({blocks.k}) must divide the interval ({interval})")
  return chunk


def _load(ref, mask):
  """``ref``'s block, zero where ``mask`` (None: no mask) is False (Triton refuses a fill
  value without a mask; a float fill casts to 8-bit payloads)."""
  from jax.experimental.pallas import triton as plgpu
  return plgpu.load(ref, mask=mask, other=None if mask is None else 0.0)


def _payload(x: jax.Array, convert_in_kernel: bool) -> jax.Array:
  if convert_in_kernel or x.dtype == jnp.bfloat16:
    return x
  # The barrier keeps XLA from folding an f32 -> fp8 -> bf16 round trip away.
  return lax.optimization_barrier(x).astype(jnp.bfloat16)


def _pad_last(x: jax.Array, size: int) -> jax.Array:
  extra = size - x.shape[-1]
  return x if extra == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])


def _params(blocks: Blocks, interpret: bool):
  if interpret:
    return None
  from jax.experimental.pallas import triton as plgpu
  return plgpu.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages)


def _rows_kernel(group_ref, start_ref, end_ref, a_ref, sa_ref, b_ref, sb_ref, o_ref, *,
                 blocks: Blocks, chunk: int, n_int: int, interval: int, transpose_b: bool,
                 aligned: bool, b_block_n: int, fp8_dots: bool):
  """Program (c, t): o[start:end, c-block] = sum_j promote_j(x[start:end, I_j] . w_g[I_j])."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu

  c, t = pl.program_id(0), pl.program_id(1)
  g, start, end = group_ref[t], start_ref[t], end_ref[t]
  bm, bn = blocks.m, blocks.n
  n_out, depth = o_ref.shape[1], a_ref.shape[1]
  e = b_ref.shape[0]
  tail_ok = start + lax.broadcasted_iota(jnp.int32, (bm, 1), 0) < end
  # Whole tiles of a group need no row masks (the rows past the groups keep theirs).
  row_ok = None if aligned else tail_ok
  row_ok1 = None if aligned else start + lax.broadcasted_iota(jnp.int32, (bm,), 0) < end
  col_ok = None  # [1, bn]; None where every column block is whole
  if n_out % bn:
    col_ok = c * bn + lax.broadcasted_iota(jnp.int32, (1, bn), 1) < n_out
  k_tail = depth % interval != 0  # chunks past K in the last interval: masked to zero

  def dot_chunk(k0):
    k_ok = (k0 + lax.broadcasted_iota(jnp.int32, (1, chunk), 1) < depth) if k_tail else None
    x = _load(a_ref.at[pl.ds(start, bm), pl.ds(k0, chunk)], _and(row_ok, k_ok))
    x = smp.mma_operand(x, fp8_dots)
    if transpose_b:  # b[g] is [F, K]: load [bn, chunk], contract the last axes
      mask = _and(None if col_ok is None else col_ok.reshape(bn, 1), k_ok)
      y = _load(b_ref.at[g, pl.ds(c * bn, bn), pl.ds(k0, chunk)], mask)
      return lax.dot_general(x, smp.mma_operand(y, fp8_dots), (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32)
    mask = _and(None if k_ok is None else k_ok.reshape(chunk, 1), col_ok)  # b[g] is [K, F]
    y = _load(b_ref.at[g, pl.ds(k0, chunk), pl.ds(c * bn, bn)], mask)
    return jnp.dot(x, smp.mma_operand(y, fp8_dots), preferred_element_type=jnp.float32)

  def interval_step(jj, acc):
    part = None
    for i in range(interval // chunk):
      prod = dot_chunk(pl.multiple_of(jj * interval + i * chunk, chunk))
      part = prod if part is None else part + prod
    sa = _load(sa_ref.at[pl.ds(start, bm), jj], row_ok1)  # a strided column of [N, J]
    if b_block_n % bn == 0:  # one weight scale for the whole column block
      return acc + part * (sa * sb_ref[g, jj, c * bn // b_block_n])[:, None]
    sb = sb_ref[g, jj, pl.ds(c * bn, bn)]  # per column, padded to whole column blocks
    return acc + part * (sa[:, None] * sb[None, :])

  def store(acc, rows):
    plgpu.store(o_ref.at[pl.ds(start, bm), pl.ds(c * bn, bn)], acc.astype(o_ref.dtype),
                mask=_and(rows, col_ok))

  @pl.when((end > start) & (g < e))
  def _():  # a static trip count (Triton pipelines the loads across intervals)
    store(lax.fori_loop(0, n_int, interval_step, jnp.zeros((bm, bn), jnp.float32)), row_ok)

  @pl.when((end > start) & (g == e))
  def _():  # rows past sum(group_sizes)
    store(jnp.zeros((bm, bn), jnp.float32), tail_ok)


def grouped_scaled_matmul(a: jax.Array, a_scale_inv: jax.Array, b: jax.Array,
                          b_scale_inv: jax.Array, group_sizes: jax.Array, *,
                          transpose_b: bool = False, interval: int = 128,
                          b_block_n: int = 128, out_dtype=jnp.float32, blocks: Blocks | None = None,
                          groups_aligned: bool = False, convert_in_kernel: bool = False,
                          fp8_dots: bool = False, interpret: bool = False) -> jax.Array:
  """Fprop / Dgrad: ``y[n] = sum_j (a[n, I_j] . b[g(n)][I_j]) * sa[n, j] * sb[g(n), j]``.

  Args:
    a: payload [N, K], rows sorted by group (8-bit float or bfloat16).
    a_scale_inv: [N, J] one multiplier per row and interval of K, ``J = ceil(K /
      interval)`` (a 1 x ``interval`` tile QTensor's ``scale_inv``).
    b: payload [E, K, F]; with ``transpose_b`` [E, F, K] (contraction-last: the layout
      FP8 dots read; ``fp8jax.gemm.grouped`` passes its weights either way).
    b_scale_inv: [E, J, ceil(F / b_block_n)]; with ``transpose_b`` [E, ceil(F / b_block_n),
      J] (a ``[b_block_n, interval]`` block QTensor's ``scale_inv``).
    group_sizes: int [E] rows per group, summing to at most N; rows past the sum give 0.
    transpose_b: the layout of ``b`` (above).
    interval: promotion interval along K (see ``scaled_matmul_pallas.supports_interval``).
    b_block_n: columns of F per weight scale (1: per-column scales).
    out_dtype: output dtype (float32 accumulation).
    blocks: output tile ``m x n`` per program, ``k`` elements of K per dot (dividing the
      interval), Triton warps and stages; None: ``ROWS`` (``ROWS_FP8`` with ``fp8_dots``).
    groups_aligned: every group size is a multiple of ``blocks.m`` (e.g. groups padded by
      ``fp8jax.gemm.padding.pad_groups`` to 128 rows): whole row tiles, no row masks. With
      other sizes the result is wrong.
    convert_in_kernel: load 8-bit payloads as they are, convert in the kernel.
    fp8_dots: multiply the 8-bit payloads on the FP8 tensor cores instead of as bfloat16
      (E4M3 or E5M2, one format for both). The products stay exact, but each MMA
      instruction's sum (32 products on Hopper) is formed by the tensor core, with its
      own alignment and truncation, then added to the float32 accumulator (Triton's FP8
      default ``max_num_imprecise_acc=0``, not set by JAX): not the exact sums. On Hopper
      (``scripts/bench/grouped_scaled_variants.py``, the kernel's copy in this
      configuration), 99.94% of the float32 outputs of the 2B gate GEMM at 2048 tokens
      had the bits of the bfloat16 dots (relative 2.6e-9), and the Fprop was the faster
      (docs/performance/archive/2026-11-26_grouped_blockwise_fp8_dots.md). Interpreted:
      exact products, float32 sums.
    interpret: run with the Pallas interpreter (CPU).

  Returns:
    [N, F] in ``out_dtype``.
  """
  from jax.experimental import pallas as pl

  if a.ndim != 2 or b.ndim != 3 or group_sizes.shape != (b.shape[0],):
    raise ValueError(f"need a [N, K], b [E, K, F] (or [E, F, K]) and group_sizes [E]; got "
                     f"{a.shape}, {b.shape} and {group_sizes.shape}")
  n, k = a.shape
  e = b.shape[0]
  f, depth = (b.shape[1], b.shape[2]) if transpose_b else (b.shape[2], b.shape[1])
  if depth != k:
    raise ValueError(f"a's K ({k}) does not match b's contraction axis ({depth}) for b of "
                     f"shape {b.shape} (transpose_b={transpose_b})")
  blocks = blocks or (ROWS_FP8 if fp8_dots else ROWS)
  chunk = _chunk(interval, blocks, (a, b))
  smp.check_fp8_dots(fp8_dots, a.dtype, b.dtype, chunk)
  n_int, n_sb = _cdiv(k, interval), _cdiv(f, b_block_n)
  want_sb = (e, n_sb, n_int) if transpose_b else (e, n_int, n_sb)
  if a_scale_inv.shape != (n, n_int) or b_scale_inv.shape != want_sb:
    raise ValueError(f"scales must be [N, J] = {(n, n_int)} and {want_sb}, got "
                     f"{a_scale_inv.shape} and {b_scale_inv.shape}")
  if n == 0 or f == 0:
    return jnp.zeros((n, f), out_dtype)
  # [N, J] as the quantization lays it out, read by the kernel a strided column per
  # interval: no transposition for XLA to fuse into the tile amax (a gate GEMM faster, the
  # recipe's whole pass unchanged: docs/performance/archive/2026-11-26_pair_fusions_wgrad.md).
  sa = a_scale_inv.astype(jnp.float32)
  sb = b_scale_inv.astype(jnp.float32)
  if transpose_b:
    sb = jnp.swapaxes(sb, 1, 2)  # [E, J, n_sb]
  if b_block_n % blocks.n:  # per column [E, J, F_pad] (1/interval of the weight's elements)
    sb = _pad_last(jnp.repeat(sb, b_block_n, axis=2)[:, :, :f], _cdiv(f, blocks.n) * blocks.n)
  group, start, end = gmp.row_tiles(group_sizes.astype(jnp.int32), n, blocks.m)
  kernel = functools.partial(_rows_kernel, blocks=blocks, chunk=chunk, n_int=n_int,
                             interval=interval, transpose_b=transpose_b,
                             aligned=groups_aligned, b_block_n=b_block_n, fp8_dots=fp8_dots)
  # Column blocks fastest: the programs in flight share their row tiles in L2 (faster at
  # the 2B shapes, alone and with the row masks and per-column weight scales gone:
  # scripts/bench/grouped_scaled_variants.py,
  # docs/performance/archive/2026-11-26_grouped_blockwise_fp8_dots.md).
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((n, f), out_dtype),
      grid=(pl.cdiv(f, blocks.n), group.shape[0]),
      compiler_params=_params(blocks, interpret),
      interpret=interpret,
      name="fp8jax_grouped_scaled_dgrad" if transpose_b else "fp8jax_grouped_scaled_rows",
  )(group, start, end, _payload(a, convert_in_kernel or fp8_dots), sa,
    _payload(b, convert_in_kernel or fp8_dots), sb)


def _wgrad_kernel(start_ref, end_ref, a_ref, sa_ref, b_ref, sb_ref, o_ref, *, blocks: Blocks,
                  chunk: int, interval: int, aligned: bool, rows_first: bool,
                  fp8_dots: bool):
  """Program (c, i, g): dw[g, i-block, c-block] over the intervals group g's rows touch."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu

  c, i, g = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  start, end = start_ref[g], end_ref[g]
  bm, bn = blocks.m, blocks.n
  kd, fd = o_ref.shape[1], o_ref.shape[2]
  # Column masks, [m, 1] for operands [K, N] and [1, m] for operands [N, K] (rows_first).
  col = (lambda m: (1, m)) if rows_first else (lambda m: (m, 1))  # noqa: E731
  col_axis = 1 if rows_first else 0
  k_ok = (i * bm + lax.broadcasted_iota(jnp.int32, col(bm), col_axis) < kd) if kd % bm \
      else None
  f_ok = (c * bn + lax.broadcasted_iota(jnp.int32, col(bn), col_axis) < fd) if fd % bn \
      else None
  first = lax.div(start, jnp.int32(interval))  # sizes are >= 0
  steps = jnp.where(end > start, lax.div(end + (interval - 1), jnp.int32(interval)) - first,
                    0)

  def interval_step(s, acc):
    jj = first + s
    part = None
    for q in range(interval // chunk):
      r0 = pl.multiple_of(jj * interval + q * chunk, chunk)
      rows = None
      if not aligned:  # rows of this group only (also keeps loads inside the array)
        shape, axis = ((chunk, 1), 0) if rows_first else ((1, chunk), 1)
        r = r0 + lax.broadcasted_iota(jnp.int32, shape, axis)
        rows = (r >= start) & (r < end)
      if rows_first:  # a [N, K], b [N, F]: [chunk, m] tiles, contracted over their rows
        x = _load(a_ref.at[pl.ds(r0, chunk), pl.ds(i * bm, bm)], _and(k_ok, rows))
        y = _load(b_ref.at[pl.ds(r0, chunk), pl.ds(c * bn, bn)], _and(f_ok, rows))
        contract = (((0,), (0,)), ((), ()))
      else:  # a [K, N], b [F, N]: [m, chunk] tiles, contracted over their columns
        x = _load(a_ref.at[pl.ds(i * bm, bm), pl.ds(r0, chunk)], _and(k_ok, rows))
        y = _load(b_ref.at[pl.ds(c * bn, bn), pl.ds(r0, chunk)], _and(f_ok, rows))
        contract = (((1,), (1,)), ((), ()))
      prod = lax.dot_general(smp.mma_operand(x, fp8_dots), smp.mma_operand(y, fp8_dots), contract,
                             preferred_element_type=jnp.float32)
      part = prod if part is None else part + prod
    sa = sa_ref[jj, pl.ds(i * bm, bm)]  # scales padded to whole blocks
    sb = sb_ref[jj, pl.ds(c * bn, bn)]
    return acc + part * (sa[:, None] * sb[None, :])

  acc = lax.fori_loop(jnp.int32(0), steps, interval_step, jnp.zeros((bm, bn), jnp.float32))
  mask = _and(None if k_ok is None else k_ok.reshape(bm, 1),
              None if f_ok is None else f_ok.reshape(1, bn))
  plgpu.store(o_ref.at[g, pl.ds(i * bm, bm), pl.ds(c * bn, bn)], acc.astype(o_ref.dtype),
              mask=mask)


def grouped_scaled_wgrad(a: jax.Array, a_scale_inv: jax.Array, b: jax.Array,
                         b_scale_inv: jax.Array, group_sizes: jax.Array, *,
                         interval: int = 128, groups_aligned: bool = False,
                         rows_first: bool = False, out_dtype=jnp.float32,
                         blocks: Blocks | None = None, convert_in_kernel: bool = False,
                         fp8_dots: bool = False, interpret: bool = False) -> jax.Array:
  """Wgrad: ``dw[g] = sum_j (a[:, R_gj] . b[:, R_gj]^T) * sa[:, j] sb[:, j]^T`` with
  ``R_gj`` the rows of group g in interval j.

  Args:
    a: payload [K, N] (X^T; N rows sorted by group, quantized in 1 x ``interval`` tiles
      along the rows); with ``rows_first`` [N, K] (X as the forward pass has it, the same
      tiles as ``interval`` x 1 blocks): no transposed copy of the operands is needed.
    a_scale_inv: [K, J], ``J = ceil(N / interval)``; with ``rows_first`` [J, K].
    b: payload [F, N] (dY^T, the same rows); with ``rows_first`` [N, F].
    b_scale_inv: [F, J]; with ``rows_first`` [J, F].
    group_sizes: int [E] rows per group in this layout, summing to at most N (rows past
      the sum are ignored).
    interval: promotion interval along the rows.
    rows_first: the operands' layout (above).
    groups_aligned: every group starts and ends on an interval boundary (sizes multiples
      of ``interval``, e.g. from ``fp8jax.gemm.padding.pad_groups``): no row masks. With
      other sizes the result is wrong.
    out_dtype, blocks, convert_in_kernel, fp8_dots, interpret: as
      :func:`grouped_scaled_matmul` (``blocks.m`` along K, ``blocks.n`` along F,
      ``blocks.k`` rows per dot; None: ``WGRAD``, ``WGRAD_FP8`` with ``fp8_dots``).

  Returns:
    [E, K, F] in ``out_dtype``; zeros for empty groups.
  """
  from jax.experimental import pallas as pl

  rows = 0 if rows_first else 1  # the axis of a and b that holds the N rows
  if a.ndim != 2 or b.ndim != 2 or a.shape[rows] != b.shape[rows] or group_sizes.ndim != 1:
    want = "a [N, K], b [N, F]" if rows_first else "a [K, N], b [F, N]"
    raise ValueError(f"need {want} and group_sizes [E]; got {a.shape}, {b.shape} and "
                     f"{group_sizes.shape}")
  blocks = blocks or (WGRAD_FP8 if fp8_dots else WGRAD)
  chunk = _chunk(interval, blocks, (a, b))
  smp.check_fp8_dots(fp8_dots, a.dtype, b.dtype, chunk)
  n, kd, fd, e = a.shape[rows], a.shape[1 - rows], b.shape[1 - rows], group_sizes.shape[0]
  n_int = _cdiv(n, interval)
  want_a, want_b = ((n_int, kd), (n_int, fd)) if rows_first else ((kd, n_int), (fd, n_int))
  if a_scale_inv.shape != want_a or b_scale_inv.shape != want_b:
    raise ValueError(f"scales must be {want_a} and {want_b}, got "
                     f"{a_scale_inv.shape} and {b_scale_inv.shape}")
  if n == 0 or kd == 0 or fd == 0 or e == 0:
    return jnp.zeros((e, kd, fd), out_dtype)
  sizes = group_sizes.astype(jnp.int32)
  ends = jnp.cumsum(sizes)
  per_interval = (lambda s: s) if rows_first else (lambda s: jnp.swapaxes(s, 0, 1))  # noqa: E731
  sa = _pad_last(per_interval(a_scale_inv.astype(jnp.float32)),
                 _cdiv(kd, blocks.m) * blocks.m)  # [J, K_pad]
  sb = _pad_last(per_interval(b_scale_inv.astype(jnp.float32)),
                 _cdiv(fd, blocks.n) * blocks.n)  # [J, F_pad]
  kernel = functools.partial(_wgrad_kernel, blocks=blocks, chunk=chunk, interval=interval,
                             aligned=groups_aligned, rows_first=rows_first,
                             fp8_dots=fp8_dots)
  # Column blocks fastest, then row blocks: the programs in flight share a group's rows.
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((e, kd, fd), out_dtype),
      grid=(pl.cdiv(fd, blocks.n), pl.cdiv(kd, blocks.m), e),
      compiler_params=_params(blocks, interpret),
      interpret=interpret,
      name="fp8jax_grouped_scaled_wgrad",
  )(ends - sizes, ends, _payload(a, convert_in_kernel or fp8_dots), sa,
    _payload(b, convert_in_kernel or fp8_dots), sb)


__all__ = ["ROWS", "ROWS_FP8", "WGRAD", "WGRAD_FP8", "Blocks", "grouped_scaled_matmul",
           "grouped_scaled_wgrad"]
