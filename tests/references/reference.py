"""Independent NumPy/ml_dtypes reference for the quantization core.

Written separately from fp8jax: explicit Python loops over every block, float32
NumPy scalar arithmetic, ``np.frexp`` for power-of-two rounding (the library uses
exponent bits), and ml_dtypes casts. It takes plain parameters, not fp8jax objects.

Platform fact emulated here: XLA:CPU runs with float32 denormals flushed to zero
(inputs and results), so ``flush_subnormals=True`` (the default) zeroes float32
subnormal inputs and dequantized results, as the CPU does. GPUs keep them.
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np

F32 = np.float32
FP8_DTYPES = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "e4m3fnuz": 240.0, "e5m2fnuz": 57344.0}


def ref_block_shape(shape, kind, axes, sizes):
  """Block shape from a granularity's plain fields."""
  rank = len(shape)
  if kind == "tensor":
    return tuple(shape)
  out = [1] * rank
  for axis, size in zip(axes, sizes):
    ax = axis + rank if axis < 0 else axis
    out[ax] = shape[ax] if size is None else min(size, shape[ax])
  return tuple(out)


def ref_pow2(v: float, mode: str) -> np.float32:
  """2**k with k = floor or ceil of log2(v), k clamped to [-126, 126], via frexp."""
  v = float(v)
  if math.isinf(v):
    k = 128
  elif v == 0.0:
    k = -200
  else:
    m, e = math.frexp(v)  # v = m * 2**e, 0.5 <= m < 1
    k = e - 1
    if mode == "ceil" and m != 0.5:
      k += 1
  k = min(max(k, -126), 126)
  return F32(2.0**k)


def round24(v: float) -> float:
  """``v`` rounded to 24 significant bits, ties to even, with an unbounded exponent (float32
  precision, never a subnormal, an overflow or a flush); from frexp."""
  if v == 0.0 or not math.isfinite(v):
    return v
  m, e = math.frexp(v)  # 0.5 <= |m| < 1: m * 2**24 is exact in float64
  return math.ldexp(round(m * 2.0**24), e - 24)  # round(): half to even


def ref_scale(amax, fmt, eps, margin, scale_format, rounding):
  """(s, scale_inv) as float32 scalars for one block; ``amax`` +inf or NaN marks a block
  holding a non-finite value: (1, NaN)."""
  if not math.isfinite(float(amax)):
    return F32(1.0), F32(np.nan)
  fmax = F32(FP8_MAX[fmt])
  a = max(F32(amax), F32(eps))
  with np.errstate(divide="ignore", over="ignore"):
    if scale_format == "pow2" and rounding == "rceil":
      # The smallest power of two >= amax * 2**margin / fmax, the quotient rounded to
      # float32 precision without a float32 exponent range (a subnormal quotient would
      # lose bits, a flushed one the margin).
      inv = ref_pow2(round24(float(a) / float(fmax)) * 2.0**margin, "ceil")
      s = F32(F32(1.0) / inv)
    elif scale_format == "pow2":
      s = ref_pow2(F32(F32(fmax * F32(2.0**-margin)) / a), rounding)
    else:
      s = F32(F32(fmax * F32(2.0**-margin)) / a)
      s = F32(min(max(s, F32(2.0**-126)), F32(2.0**126)))
  if a == 0:
    s = F32(1.0)
  return s, F32(F32(1.0) / s)


def flush(v: np.ndarray) -> np.ndarray:
  """float32 subnormals -> signed zero."""
  v = np.asarray(v, np.float32)
  tiny = np.abs(v) < np.finfo(np.float32).tiny
  return np.where(tiny, np.copysign(F32(0), v), v).astype(np.float32)


def ref_quantize(x: np.ndarray, fmt: str, kind: str, axes, sizes, *, eps=1e-12,
                 margin=0, scale_format="fp32", rounding="floor", store_e8m0=False,
                 flush_subnormals=True, amax=None):
  """Returns (payload, scale_inv, dequantized) computed block by block.

  ``amax``, when given, replaces every block's own amax (delayed scaling).
  """
  dt = FP8_DTYPES[fmt]
  fmax = F32(FP8_MAX[fmt])
  shape = x.shape
  block = ref_block_shape(shape, kind, axes, sizes)
  counts = tuple(math.ceil(d / b) for d, b in zip(shape, block))
  payload = np.zeros(shape, dt)
  scale_inv = np.zeros(counts, np.float32)
  deq = np.zeros(shape, np.float32)
  xf = x.astype(np.float32)
  if flush_subnormals:
    xf = flush(xf)
  for idx in itertools.product(*[range(n) for n in counts]):
    sl = tuple(slice(i * b, min((i + 1) * b, d)) for i, b, d in zip(idx, block, shape))
    tile = xf[sl]
    finite = tile[np.isfinite(tile)]
    tile_amax = F32(np.max(np.abs(finite))) if finite.size else F32(0.0)
    s, inv = ref_scale(tile_amax if amax is None else amax, fmt, eps, margin,
                       scale_format, rounding)
    if finite.size < tile.size:  # NaN or inf in the block: s = 1 and a NaN scale_inv
      s, inv = F32(1.0), F32(np.nan)
    scale_inv[idx] = inv
    with np.errstate(invalid="ignore", over="ignore"):
      scaled = (tile * s).astype(np.float32)
      q = np.clip(scaled, -fmax, fmax).astype(dt)
      deq[sl] = q.astype(np.float32) * inv
    payload[sl] = q
  if flush_subnormals:
    deq = flush(deq)
  if store_e8m0:
    scale_inv = scale_inv.astype(ml_dtypes.float8_e8m0fnu)
  top = np.float32(ml_dtypes.finfo(x.dtype).max)
  deq = np.clip(deq, -top, top)  # finite in, finite out
  return payload, scale_inv, deq.astype(x.dtype)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
  """Bitwise equality, treating any two NaNs as equal."""
  a = np.asarray(a)
  b = np.asarray(b)
  if a.dtype != b.dtype or a.shape != b.shape:
    return False
  nan_a = np.isnan(a.astype(np.float32))
  nan_b = np.isnan(b.astype(np.float32))
  if not np.array_equal(nan_a, nan_b):
    return False
  width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
  return np.array_equal(a.view(width)[~nan_a], b.view(width)[~nan_b])
