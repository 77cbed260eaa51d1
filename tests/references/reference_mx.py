"""Independent NumPy reference for MX (OCP Microscaling v1.0) and NVFP4 quantization.

Written from the written contract, the OCP MX v1.0 specification and ml_dtypes, without
reading fp8jax's implementation. Every block is visited by an explicit Python loop and
every element is rounded by a scalar float64 routine (its own round-half-to-even on the
format's grid, not an ml_dtypes cast); float32 arithmetic is emulated by computing in
float64 and rounding once to float32, which is exact for products of two float32 values
and correctly rounded for one quotient (53 >= 2 * 24 + 2 bits).

Platform fact emulated (as in ``tests/references/reference.py``): XLA:CPU flushes float32
subnormals to zero, in inputs and in results. With ``flush_subnormals=True`` (the
default) every float32 intermediate below 2**-126 in magnitude becomes a signed zero.

Sources:
  OCP MX v1.0 section 5.3 (element formats FP8 E4M3/E5M2, FP6 E2M3/E3M2, FP4 E2M1),
  section 5.4 (scale format E8M0: 2**-127..2**127, 0xFF = NaN, no zero, no sign),
  section 6.3 (conversion: X = 2**(floor(log2(amax)) - emax_elem), elements rounded to
  nearest even and clamped to the element's max normal); a NaN scale makes every
  element of its block NaN.
  Round-up ("rceil") scales: MXFP8 pretraining recipe, arXiv 2506.08027.
  NVFP4 two-level scales: arXiv 2509.25149 and Transformer Engine's NVFP4 recipe.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)
FLT_TINY = float(np.finfo(np.float32).tiny)  # 2**-126


@dataclasses.dataclass(frozen=True)
class Fmt:
  """Element format facts, written out from the OCP tables (not read from ml_dtypes)."""

  name: str
  dtype: type
  storage: type
  max: float
  min_normal: float
  min_subnormal: float
  mantissa_bits: int
  emax: int
  has_inf: bool
  has_nan: bool


# OCP MX v1.0 section 5.3: FP8 (5.3.1, the OFP8 formats), FP6 (5.3.2), FP4 (5.3.3).
FORMATS = {
    "e4m3": Fmt("e4m3", ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fn,
                448.0, 2.0**-6, 2.0**-9, 3, 8, False, True),
    "e5m2": Fmt("e5m2", ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2,
                57344.0, 2.0**-14, 2.0**-16, 2, 15, True, True),
    # FP6 payloads travel in float8_e4m3fn, which holds every FP6 value exactly.
    "e2m3": Fmt("e2m3", ml_dtypes.float6_e2m3fn, ml_dtypes.float8_e4m3fn,
                7.5, 1.0, 0.125, 3, 2, False, False),
    "e3m2": Fmt("e3m2", ml_dtypes.float6_e3m2fn, ml_dtypes.float8_e4m3fn,
                28.0, 0.25, 0.0625, 2, 4, False, False),
    "e2m1": Fmt("e2m1", ml_dtypes.float4_e2m1fn, ml_dtypes.float4_e2m1fn,
                6.0, 1.0, 0.5, 1, 2, False, False),
}
ALIASES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float6_e2m3fn": "e2m3",
           "float6_e3m2fn": "e3m2", "float4_e2m1fn": "e2m1"}
E4M3 = FORMATS["e4m3"]


def fmt_of(name) -> Fmt:
  """Fmt from a short name, an ml_dtypes name, or an object with a ``name``."""
  name = name if isinstance(name, str) else name.name
  name = name.lower()
  return FORMATS[ALIASES.get(name, name)]


# ---------------------------------------------------------------------------------------
# float32 emulation


def f32(v: float, ftz: bool = True) -> float:
  """``v`` (float64) rounded once to float32 (overflow -> inf); subnormals -> ±0 if ftz."""
  with np.errstate(over="ignore"):
    r = float(F32(v))
  if ftz and r != 0.0 and abs(r) < FLT_TINY:
    r = math.copysign(0.0, r)
  return r


def round_24_bits(v: float) -> float:
  """``v`` > 0 rounded to 24 significant bits (float32 precision), ties to even, at any
  exponent (no subnormal, overflow or flush)."""
  m, e = math.frexp(v)
  return math.ldexp(round(m * 2.0**24), e - 24)


def floor_log2(v: float) -> int:
  """floor(log2 v) for finite v > 0, from frexp (v = m * 2**e, 0.5 <= m < 1)."""
  _, e = math.frexp(v)
  return e - 1


def ceil_log2(v: float) -> int:
  """ceil(log2 v) for finite v > 0."""
  m, e = math.frexp(v)
  return e - 1 if m == 0.5 else e


# ---------------------------------------------------------------------------------------
# element rounding (section 6.3: round to nearest even, clamp to +-max normal)


def grid_ulp(a: float, fmt: Fmt) -> float:
  """Spacing of the format's grid at magnitude ``a`` (0 <= a < max)."""
  if a < fmt.min_normal:
    return fmt.min_subnormal
  return 2.0 ** (floor_log2(a) - fmt.mantissa_bits)


def round_nearest(v: float, fmt: Fmt) -> float:
  """Round-half-to-even onto the format's grid, saturating to ±max; ±inf -> ±max.

  NaN stays NaN (the caller handles NaN for formats without NaN); the sign of zero is
  kept.
  """
  if math.isnan(v):
    return math.nan
  a = abs(v)
  if a >= fmt.max:  # includes inf
    r = fmt.max
  else:
    ulp = grid_ulp(a, fmt)
    q = a / ulp  # exact: a power-of-two divisor within float64's range
    n = math.floor(q)
    frac = q - n
    if frac > 0.5 or (frac == 0.5 and n % 2 == 1):
      n += 1
    r = min(n * ulp, fmt.max)
  return math.copysign(r, v)


def neighbours(v: float, fmt: Fmt) -> tuple[float, float]:
  """(lo, hi): the grid magnitudes around |v| (lo <= |v| <= hi), for |v| < max."""
  a = abs(v)
  assert a < fmt.max, v
  ulp = grid_ulp(a, fmt)
  lo = math.floor(a / ulp) * ulp
  return lo, (lo if lo == a else lo + ulp)


def round_array(v: np.ndarray, fmt: Fmt) -> np.ndarray:
  """``round_nearest`` element by element (float64 result)."""
  v = np.asarray(v, np.float64)
  return np.array([round_nearest(float(e), fmt) for e in v.ravel()]).reshape(v.shape)


# ---------------------------------------------------------------------------------------
# blocks


def block_shape(shape, kind: str, axes, sizes) -> tuple[int, ...]:
  """Block shape of a granularity's plain fields (tile: 1 x n; block: n x m)."""
  rank = len(shape)
  if kind == "tensor":
    return tuple(shape)
  out = [1] * rank
  for axis, size in zip(axes, sizes):
    ax = axis % rank
    out[ax] = shape[ax] if size is None else min(size, shape[ax])
  return tuple(max(b, 1) for b in out)  # an empty dim has no blocks


def blocks(shape, block):
  """Yields (block index, tuple of slices); edge blocks are smaller."""
  counts = [math.ceil(d / b) if d else 0 for d, b in zip(shape, block)]
  for idx in itertools.product(*[range(n) for n in counts]):
    yield idx, tuple(slice(i * b, min((i + 1) * b, d))
                     for i, b, d in zip(idx, block, shape))


def finite_amax(values: np.ndarray) -> float:
  """max |x| over the finite float32 values; 0 when there are none."""
  best = 0.0
  for e in np.asarray(values, np.float32).ravel():
    e = float(e)
    if math.isfinite(e) and abs(e) > best:
      best = abs(e)
  return best


# ---------------------------------------------------------------------------------------
# scales


def pow2_scale(amax: float, fmt: Fmt, rule: str, eps: float, margin: int = 0,
               ftz: bool = True) -> tuple[float, float]:
  """(s, scale_inv) of one block for power-of-two scales; both in [2**-126, 2**126]."""
  a = max(amax, f32(eps, ftz))
  if a == 0.0:
    return 1.0, 1.0

  def inv_from_exponent(k):  # scale_inv = 2**k, biased exponent clamped to [1, 253]
    k = min(max(k, -126), 126)
    return 2.0**-k, 2.0**k

  if rule == "ocp":  # section 6.3: X = 2**(floor(log2 amax) - emax_elem)
    return inv_from_exponent(floor_log2(a) - fmt.emax)
  if rule == "rceil":  # smallest power of two >= amax * 2**m / max_elem
    # The quotient rounded to float32 precision with an unbounded exponent: the exponent
    # of a, the margin and the clamp never interact with the rounding.
    return inv_from_exponent(ceil_log2(round_24_bits(a / fmt.max)) + margin)
  if rule in ("floor", "ceil"):  # s = 2**floor/ceil(log2(max_elem * 2**-m / amax))
    r = f32(f32(fmt.max * 2.0**-margin, ftz) / a, ftz)
    if math.isinf(r):
      k = 128
    else:
      k = floor_log2(r) if rule == "floor" else ceil_log2(r)
    k = min(max(k, -126), 126)
    return 2.0**k, 2.0**-k
  raise ValueError(rule)


def fp32_scale(amax: float, fmt: Fmt, eps: float, margin: int = 0,
               ftz: bool = True) -> tuple[float, float]:
  """(s, scale_inv) of one block for FP32 scales."""
  a = max(amax, f32(eps, ftz))
  if a == 0.0:
    return 1.0, 1.0
  s = f32(f32(fmt.max * 2.0**-margin, ftz) / a, ftz)
  s = min(max(s, 2.0**-126), 2.0**126)
  return s, f32(1.0 / s, ftz)


def nvfp4_tensor_scale(g: float, fmt: Fmt, eps: float, ftz: bool = True):
  """(S_enc, D = tensor_scale_inv) from the tensor's finite amax ``g``."""
  g = max(g, f32(eps, ftz))
  if g == 0.0:
    s_enc = 1.0
  else:
    s_enc = f32(E4M3.max * fmt.max / g, ftz)  # 2688 / G' for E2M1
    s_enc = min(max(s_enc, 2.0**-126), 2.0**126)
  return s_enc, f32(1.0 / s_enc, ftz)


def nvfp4_block_scale(amax_b: float, s_enc: float, d: float, fmt: Fmt, ftz: bool = True):
  """(sd = the E4M3 block scale_inv, enc = the block's encode multiplier)."""
  m = f32(s_enc * f32(1.0 / fmt.max, ftz), ftz)
  sd = round_nearest(min(f32(amax_b * m, ftz), E4M3.max), E4M3)
  prod = f32(sd * d, ftz)
  enc = FLT_MAX if prod == 0.0 else min(f32(1.0 / prod, ftz), FLT_MAX)
  return sd, enc


# ---------------------------------------------------------------------------------------
# the whole quantizer


@dataclasses.dataclass
class RefQuant:
  """Reference results.

  payload: storage-dtype array (shape of x). scale_inv: per block (float32, or
  float8_e8m0fnu / float8_e4m3fn). tensor_scale_inv: float32 scalar (NVFP4) or None.
  deq: dequantized, in ``out_dtype``. enc: float32 per-block multiplier applied to x.
  scaled: float32 x * enc per element (before rounding). unspecified: bool mask of
  payload elements the contract leaves open (none: a block holding NaN or inf has
  enc = 1, so its payload is x saturated, NaN as +0 in formats without NaN).
  """

  payload: np.ndarray
  scale_inv: np.ndarray
  tensor_scale_inv: np.ndarray | None
  deq: np.ndarray
  enc: np.ndarray
  scaled: np.ndarray
  unspecified: np.ndarray
  block: tuple


def ref_quantize(x, fmt, block, *, scale_format="pow2", pow2_rounding="ocp", eps=1e-12,
                 margin=0, store_e8m0=False, out_dtype=None, flush_subnormals=True):
  """Quantizes ``x`` block by block; returns a ``RefQuant``."""
  fmt = fmt_of(fmt)
  ftz = flush_subnormals
  x = np.asarray(x)
  out_dtype = np.dtype(out_dtype or x.dtype)
  xf = np.array([f32(float(e), ftz) for e in x.astype(np.float32).ravel()],
                np.float64).reshape(x.shape)
  block = tuple(block)
  counts = tuple(math.ceil(d / b) for d, b in zip(x.shape, block))
  pay = np.zeros(x.shape, np.float64)
  scaled = np.zeros(x.shape, np.float64)
  deq = np.zeros(x.shape, np.float64)
  unspecified = np.zeros(x.shape, bool)
  scale_inv = np.zeros(counts, np.float64)
  enc_all = np.zeros(counts, np.float64)
  tensor_inv = None
  if scale_format == "e4m3":  # G: the largest amax of the blocks free of NaN and inf
    g = max((finite_amax(xf[sl]) for _, sl in blocks(x.shape, block)
             if np.all(np.isfinite(xf[sl]))), default=0.0)
    s_enc, d = nvfp4_tensor_scale(g, fmt, eps, ftz)
    tensor_inv = F32(d)
  for idx, sl in blocks(x.shape, block):
    tile = xf[sl]
    amax = finite_amax(tile)
    if scale_format == "pow2":
      enc, inv = pow2_scale(amax, fmt, pow2_rounding, eps, margin, ftz)
    elif scale_format == "fp32":
      enc, inv = fp32_scale(amax, fmt, eps, margin, ftz)
    elif scale_format == "e4m3":
      inv, enc = nvfp4_block_scale(amax, s_enc, d, fmt, ftz)
    else:
      raise ValueError(scale_format)
    if not all(math.isfinite(e) for e in tile.ravel()):
      # NaN or inf in the block: a NaN scale (E8M0 0xFF; OCP sections 5.4, 6.3) makes the
      # whole block NaN; the payload is x itself, saturated (enc = 1).
      enc, inv = 1.0, math.nan
    vals = np.array([f32(e * enc, ftz) for e in tile.ravel()])
    q = np.array([round_nearest(v, fmt) for v in vals])
    nan_in = np.isnan(tile.ravel())
    if not fmt.has_nan:
      q[nan_in] = 0.0  # +0 payload for a NaN element where the format has no NaN
    if scale_format == "e4m3":
      r = np.array([f32(f32(p * inv, ftz) * d, ftz) for p in q])
    else:
      r = np.array([f32(p * inv, ftz) for p in q])
    scaled[sl] = vals.reshape(tile.shape)
    pay[sl] = q.reshape(tile.shape)
    deq[sl] = r.reshape(tile.shape)
    scale_inv[idx] = inv
    enc_all[idx] = enc
  with np.errstate(over="ignore", invalid="ignore"):
    payload = pay.astype(fmt.storage)
    assert np.array_equal(payload.astype(np.float64), pay, equal_nan=True)
    top = float(ml_dtypes.finfo(out_dtype).max)
    deq = np.clip(deq, -top, top).astype(np.float32).astype(out_dtype)
  if scale_format == "e4m3":
    scale_inv = scale_inv.astype(ml_dtypes.float8_e4m3fn)
  elif store_e8m0:
    scale_inv = scale_inv.astype(ml_dtypes.float8_e8m0fnu)
  else:
    scale_inv = scale_inv.astype(np.float32)
  return RefQuant(payload, scale_inv, tensor_inv, deq, enc_all.astype(np.float32),
                  scaled.astype(np.float32), unspecified, block)


def ref_for_spec(x, spec, out_dtype=None, flush_subnormals=True) -> RefQuant:
  """``ref_quantize`` driven by an fp8jax ``QuantSpec``'s plain fields."""
  if spec.four_over_six:
    raise ValueError("ref_quantize has no Four Over Six: tests/numerics/test_four_over_six.py")
  g = spec.granularity
  shape = np.shape(x)
  return ref_quantize(
      x, spec.format, block_shape(shape, g.kind, g.axes, g.sizes),
      scale_format=spec.scale_format, pow2_rounding=spec.pow2_rounding, eps=spec.eps,
      margin=spec.margin, store_e8m0=spec.store_e8m0, out_dtype=out_dtype,
      flush_subnormals=flush_subnormals)


# ---------------------------------------------------------------------------------------
# bit comparison


def bits(a: np.ndarray) -> np.ndarray:
  """Unsigned-integer view of an array (float4/6/8 -> uint8, bf16 -> uint16, ...)."""
  a = np.asarray(a)
  width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
  return a.view(width)


def mismatches(got, want, mask=None, limit=8) -> list[str]:
  """Positions where ``got`` and ``want`` differ bitwise (any NaN equals any NaN).

  ``mask`` (bool, True = compare) restricts the comparison.
  """
  got, want = np.atleast_1d(np.asarray(got)), np.atleast_1d(np.asarray(want))
  if got.dtype != want.dtype or got.shape != want.shape:
    return [f"dtype/shape {got.dtype}{got.shape} != {want.dtype}{want.shape}"]
  with np.errstate(invalid="ignore"):
    nan_g = np.isnan(got.astype(np.float32))
    nan_w = np.isnan(want.astype(np.float32))
  diff = (nan_g != nan_w) | (~nan_g & ~nan_w & (bits(got) != bits(want)))
  if mask is not None:
    diff &= mask
  out = []
  for pos in zip(*np.nonzero(diff)):
    if len(out) == limit:
      out.append(f"... {int(diff.sum())} in all")
      break
    out.append(f"{tuple(int(p) for p in pos)}: got {got[pos]!r} (0x{int(bits(got)[pos]):x}),"
               f" want {want[pos]!r} (0x{int(bits(want)[pos]):x})")
  return out
