"""Pallas (GPU Triton backend) kernel for the blockwise-scaled FP8 GEMM, FP32 mode.

The same computation as ``fp8jax.gemm.accumulate.scaled_matmul`` with FP32 accumulation, in
one pass over the operands (as DeepGEMM does it): one program per ``[block_m, block_n]``
tile of the output ``Y [B, M, N]``. It walks K in promotion intervals, in order; for each
interval it multiplies the payload tiles ``A [block_m, chunk]`` and ``Bt [block_n, chunk]``
(``chunk = min(interval, block_k)``; several chunks of an interval chain into one float32
accumulator) with a ``bf16 x bf16 -> float32`` dot (FP8 payloads are exact in bfloat16,
so the products are exact and summed in float32), then promotes
``acc = acc + partial * (sa[:, None] * sb[None, :])`` in float32, and finally stores
``acc``. The float32 summation order inside an interval is the tensor core's; Triton may
contract the promotion into an FMA (at most one float32 ulp per promotion against the
XLA loop, which rounds the product first).

The payloads may be 8-bit floats or bfloat16; 8-bit payloads are converted to bfloat16
before the kernel (or in it: ``convert_in_kernel``). M and N are padded to multiples of
the block and K to a multiple of the interval outside the kernel; the padding is sliced
off the result.

The defaults (128 x 128 x 128 tiles, 8 warps, 3 stages, bfloat16 payloads) are the
fastest of the configurations tried on Hopper (``scripts/bench/scaled_matmul.py``), slower
than a cuBLAS bf16 GEMM of the same shape; most of that gap is the per-interval promotion
(the tensor cores wait for each interval's sum), as the same kernel with a single
promotion at the end of K shows (the figures:
docs/performance/archive/2026-11-21_second_pass_pallas.md, target 4, and
docs/performance/archive/2026-11-23_grouped_blockwise_kernel.md).

Pallas is imported when the kernel is called, not when this module is imported. On
CPU, pass ``interpret=True``.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.kernels import placement

_CHUNK = 128  # K elements per dot


def supports_interval(interval: int) -> bool:
  """Whether the kernel handles promotion intervals of ``interval`` elements of K: a
  power of two from 16 to 128 (one dot each), or a multiple of 128 (chained dots)."""
  if interval <= _CHUNK:
    return interval >= 16 and interval & (interval - 1) == 0
  return interval % _CHUNK == 0


def supports_payload(dtype) -> bool:
  """Whether payloads of ``dtype`` are exact in bfloat16 (8-bit floats, bfloat16)."""
  dtype = jnp.dtype(dtype)
  return dtype == jnp.bfloat16 or (jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize == 1)


MMA_FP8 = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))
"""The 8-bit formats that Hopper's FP8 tensor cores multiply (``fp8_dots``)."""


FP8_DOTS = dict(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=4)
"""The tile for ``fp8_dots``: the fastest tried on Hopper at [16384, 1280] x [1280, 1280],
faster than the bfloat16 products' default tile (128 x 128 x 128, 8 warps, 3 stages) with
FP8 dots or with bfloat16 products (``scripts/bench/scaled_matmul.py``;
docs/performance/archive/2026-11-26_pair_one_pass_fp8_mma.md)."""


def _mma_pair(a_dtype, b_dtype) -> bool:
  return jnp.dtype(a_dtype) == jnp.dtype(b_dtype) and jnp.dtype(a_dtype) in MMA_FP8


def mma_operand(v: jax.Array, fp8_dots: bool) -> jax.Array:
  """A loaded payload tile as a kernel's dot takes it: as it is (FP8 MMA) or as bfloat16
  (exact products)."""
  return v if fp8_dots else v.astype(jnp.bfloat16)


def fp8_dots_apply(a_dtype, b_dtype, interval: int = _CHUNK) -> bool:
  """Whether payloads of these dtypes can go to the FP8 tensor cores here: one format of
  :data:`MMA_FP8` for both, dots of at least 32 elements of K (one Hopper FP8 MMA; an
  interval of 16 would make them shorter), and off GPU (interpreted: exact products) or on
  a GPU of compute capability 8.9 or newer."""
  if not (_mma_pair(a_dtype, b_dtype) and min(interval, _CHUNK) >= 32):
    return False
  return jax.default_backend() != "gpu" or placement.capability_at_least(8, 9)


def check_fp8_dots(fp8_dots: bool, a_dtype, b_dtype, chunk: int = _CHUNK) -> None:
  """A ValueError naming the dtypes (or the dot's length) where ``fp8_dots`` is asked for
  and cannot apply."""
  if fp8_dots and not _mma_pair(a_dtype, b_dtype):
    raise ValueError(f"fp8_dots needs E4M3 or E5M2 payloads of one format, got "
                     f"{jnp.dtype(a_dtype)} and {jnp.dtype(b_dtype)}")
  if fp8_dots and chunk < 32:
    raise ValueError(f"fp8_dots needs dots of at least 32 elements of K, got {chunk}")


def _block(size: int, block: int) -> int:
  """``block`` (a power of two >= 16), or less for a small ``size``: the smallest power
  of two >= ``size``, at least 16 (Triton's smallest dot)."""
  if block < 16 or block & (block - 1):
    raise ValueError(f"block sizes must be powers of two >= 16, got {block}")
  return min(block, max(16, 1 << max(size - 1, 0).bit_length()))


def _pad_to(x: jax.Array, axis: int, size: int) -> jax.Array:
  extra = size - x.shape[axis]
  if extra == 0:
    return x
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, extra)
  return jnp.pad(x, pad)


SCHEDULES = ("interval", "overlap", "flat")


def _kernel(a_ref, b_ref, sa_ref, sb_ref, o_ref, *, n_int: int, chunks: int, chunk: int,
            schedule: str, fp8_dots: bool):
  # a_ref [bm, K], b_ref [bn, K], sa_ref [J, bm], sb_ref [J, bn], o_ref [bm, bn].
  from jax.experimental import pallas as pl

  zeros = jnp.zeros(o_ref.shape, jnp.float32)

  def dot_chunk(c, part):
    # A static start (peeled intervals) needs no hint; the Triton lowering refuses one.
    k0 = c * chunk if isinstance(c, int) else pl.multiple_of(c * chunk, chunk)
    x = mma_operand(a_ref[:, pl.ds(k0, chunk)], fp8_dots)
    y = mma_operand(b_ref[:, pl.ds(k0, chunk)], fp8_dots)
    return part + lax.dot_general(x, y, (((1,), (1,)), ((), ())),
                                  preferred_element_type=jnp.float32)

  def interval_sum(j):
    if chunks <= 8:
      part = zeros
      for i in range(chunks):
        part = dot_chunk(j * chunks + i, part)
      return part
    return lax.fori_loop(0, chunks, lambda i, p: dot_chunk(j * chunks + i, p), zeros)

  def promote(j, part, acc):
    scale = sa_ref[j, :][:, None] * sb_ref[j, :][None, :]
    return acc + part * scale

  if schedule == "flat":
    # One loop over the chunks of K; the promotion runs under a condition at the end of
    # each interval.
    def flat(c, carry):
      acc, part = carry
      part = dot_chunk(c, part)
      return lax.cond(lax.rem(c + 1, chunks) == 0,
                      lambda: (promote(lax.div(c, chunks), part, acc), zeros),
                      lambda: (acc, part))

    o_ref[...] = lax.fori_loop(0, n_int * chunks, flat, (zeros, zeros))[0]
  elif schedule == "overlap":
    # Software-pipelined by one interval: the dots of interval j are issued before the
    # promotion of interval j - 1. The promotions keep their order.
    def lagged(j, carry):
      acc, prev = carry
      part = interval_sum(j)
      return promote(j - 1, prev, acc), part

    acc, last = lax.fori_loop(1, n_int, lagged, (zeros, interval_sum(0)))
    o_ref[...] = promote(n_int - 1, last, acc)
  else:
    o_ref[...] = lax.fori_loop(0, n_int, lambda j, acc: promote(j, interval_sum(j), acc),
                               zeros)


def scaled_matmul_pallas(a: jax.Array, bt: jax.Array, sa: jax.Array, sb: jax.Array, *,
                         interval: int = 128, block_m: int = 128, block_n: int = 128,
                         block_k: int = 128,
                         num_warps: int | None = 8, num_stages: int | None = 3,
                         schedule: str = "interval", n_fastest: bool | None = None,
                         convert_in_kernel: bool = False, fp8_dots: bool = False,
                         interpret: bool = False) -> jax.Array:
  """``Y[b] = sum_j (A_j . Bt_j) * (sa_j sb_j^T)`` over the K intervals j, in float32.

  Args:
    a: payload [B, M, K] (an 8-bit float or bfloat16).
    bt: payload [B, N, K] (an 8-bit float or bfloat16, not necessarily ``a``'s).
    sa: float32 [B, M, J] dequantization multipliers per row and interval of K, with
      ``J = ceil(K / interval)``.
    sb: float32 [B, N, J].
    interval: promotion interval (see :func:`supports_interval`).
    block_m, block_n: output tile per program (powers of two >= 16; smaller for small
      M or N).
    block_k: elements of K per dot (a power of two >= 16; at most the interval).
    num_warps, num_stages: Triton compiler parameters (None: Pallas defaults).
    schedule: the kernel's loop over K, all with the same result: ``"interval"`` (one
      iteration per interval), ``"overlap"`` (the dots of each interval issued before
      the promotion of the previous one) or ``"flat"`` (one iteration per ``block_k``
      elements of K, the promotion under a condition).
    n_fastest: launch the programs of one row of output tiles together (streaming Bt
      from L2) rather than those of one column; None: when N <= M.
    convert_in_kernel: load 8-bit payloads as they are and convert them to bfloat16 in
      the kernel (half the bytes read, but slower on Hopper: the conversion sits
      between the shared-memory pipeline and the tensor cores); by default they are
      converted by XLA before the kernel (exact; behind ``lax.optimization_barrier`` so
      that XLA cannot fold an f32 -> fp8 -> bf16 round trip away).
    fp8_dots: multiply E4M3 (or E5M2) payloads of one format on the FP8 tensor cores as
      they are, without a bfloat16 copy: Triton adds each MMA instruction's products (32
      on Hopper, summed by the tensor core with its alignment and truncation) to the
      float32 partial sum, so the result is near the exact products', not equal to it.
    interpret: run with the Pallas interpreter (CPU; the products are then exact).

  Returns:
    float32 [B, M, N].
  """
  if a.ndim != 3 or bt.ndim != 3 or a.shape[0] != bt.shape[0] or a.shape[2] != bt.shape[2]:
    raise ValueError(f"need A [B, M, K] and Bt [B, N, K], got {a.shape} and {bt.shape}")
  if not (supports_payload(a.dtype) and supports_payload(bt.dtype)):
    raise TypeError(f"payloads must be 8-bit floats or bfloat16, got {a.dtype} and "
                    f"{bt.dtype}")
  if not supports_interval(interval):
    raise ValueError(f"unsupported promotion interval {interval}: need a power of two "
                     f"from 16 to {_CHUNK} or a multiple of {_CHUNK}")
  nb, m, k = a.shape
  n = bt.shape[1]
  n_int = -(-k // interval)
  if sa.shape != (nb, m, n_int) or sb.shape != (nb, n, n_int):
    raise ValueError(f"scales must be [B, M, {n_int}] and [B, N, {n_int}], got {sa.shape} "
                     f"and {sb.shape}")
  check_fp8_dots(fp8_dots, a.dtype, bt.dtype, min(interval, block_k))
  from jax.experimental import pallas as pl  # lazy: no import-time cost

  if not (convert_in_kernel or fp8_dots):
    a, bt = (x if x.dtype == jnp.bfloat16 else lax.optimization_barrier(x).astype(jnp.bfloat16)
             for x in (a, bt))
  bm, bn = _block(m, block_m), _block(n, block_n)
  mp, np_, kp = -(-m // bm) * bm, -(-n // bn) * bn, n_int * interval
  a = _pad_to(_pad_to(a, 2, kp), 1, mp)
  bt = _pad_to(_pad_to(bt, 2, kp), 1, np_)
  # Scales interval-major: the kernel loads one [block] row per interval.
  sa = _pad_to(jnp.swapaxes(sa.astype(jnp.float32), 1, 2), 2, mp)
  sb = _pad_to(jnp.swapaxes(sb.astype(jnp.float32), 1, 2), 2, np_)
  if block_k < 16 or block_k & (block_k - 1) or block_k > _CHUNK:
    raise ValueError(f"block_k must be a power of two from 16 to {_CHUNK}, got {block_k}")
  chunk = min(interval, block_k)
  if schedule not in SCHEDULES:
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
  compiler_params = None
  if not interpret:
    from jax.experimental.pallas import triton as pl_triton
    compiler_params = pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
  if n_fastest is None:
    n_fastest = n <= m
  # CUDA runs program ids x fastest: programs in flight together share the tile of the
  # slower axis and stream the other operand, which should be the one that stays in L2.
  if n_fastest:
    grid = (np_ // bn, mp // bm, nb)
    ids = lambda j, i, b: (b, i, j)  # noqa: E731
  else:
    grid = (mp // bm, np_ // bn, nb)
    ids = lambda i, j, b: (b, i, j)  # noqa: E731

  def spec(block, index):
    return pl.BlockSpec(block, lambda *g: index(*ids(*g)))

  out = pl.pallas_call(
      functools.partial(_kernel, n_int=n_int, chunks=interval // chunk, chunk=chunk,
                        schedule=schedule, fp8_dots=fp8_dots),
      out_shape=jax.ShapeDtypeStruct((nb, mp, np_), jnp.float32),
      grid=grid,
      in_specs=[
          spec((None, bm, kp), lambda b, i, j: (b, i, 0)),
          spec((None, bn, kp), lambda b, i, j: (b, j, 0)),
          spec((None, n_int, bm), lambda b, i, j: (b, 0, i)),
          spec((None, n_int, bn), lambda b, i, j: (b, 0, j)),
      ],
      out_specs=spec((None, bm, bn), lambda b, i, j: (b, i, j)),
      compiler_params=compiler_params,
      interpret=interpret,
      name="fp8jax_scaled_matmul",
  )(a, bt, sa, sb)
  return out[:, :m, :n]


__all__ = ["MMA_FP8", "SCHEDULES", "check_fp8_dots", "fp8_dots_apply", "mma_operand",
           "scaled_matmul_pallas", "supports_interval", "supports_payload"]
