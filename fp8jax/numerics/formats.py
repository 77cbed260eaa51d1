"""Element formats (FP8, FP6, FP4) and the saturating cast.

The formats are ml_dtypes types:

========  =====================  =======  ====  ===  ====  ============================
name      ml_dtypes              max      emax  inf  NaN   stored payload
========  =====================  =======  ====  ===  ====  ============================
e4m3      float8_e4m3fn          448      8     no   yes   float8_e4m3fn
e5m2      float8_e5m2            57344    15    yes  yes   float8_e5m2
e2m3      float6_e2m3fn          7.5      2     no   no    float8_e4m3fn (exact subset)
e3m2      float6_e3m2fn          28       4     no   no    float8_e4m3fn (exact subset)
e2m1      float4_e2m1fn          6        2     no   no    float4_e2m1fn
e1m2      (none)                 1.75     0     no   no    float8_e4m3fn (exact subset)
int4      int4 (±7 used)         7        2     no   no    int4
========  =====================  =======  ====  ===  ====  ============================

(plus the AMD fnuz FP8 variants). The FP6 and FP4 types are the element formats of the
OCP Microscaling (MX) v1.0 specification, section 5.3; E2M1 holds ±{0, 0.5, 1, 1.5, 2, 3,
4, 6}. XLA:CPU cannot convert to the FP6 types, so their payloads are stored in E4M3,
which holds every FP6 value exactly. The uniform 4-bit grids E1M2 (±{0, 0.25, ..., 1.75},
as Huawei's ``en_dtypes.float4_e1m2``) and INT4 (±{0, 1, ..., 7}) are the same grid up
to a factor 4 (arXiv 2606.20381, UFP4); see :data:`UNIFORM_GRIDS` and docs/formats.md.

A plain ``astype`` turns values past a format's range into NaN (e4m3fn), inf (e5m2) or,
for the FP6/FP4 types, whatever the converter does (ml_dtypes maps NaN to -0 in E2M1), so
every conversion in fp8jax goes through :func:`saturating_cast` or
:func:`round_to_format`, which saturate first. Non-finite inputs follow the PTX
``cvt.rn.satfinite`` conversion: ±inf saturates to ±max (a quantized tensor never holds
inf, even in e5m2) and NaN stays NaN in the formats that have it. The formats without
NaN cannot hold it per element: the quantize ops mark the whole block NaN through its
scale instead, as an OCP MX NaN scale does (see ``fp8jax.numerics.scales``).

:func:`round_to_format` computes the float32 value of that cast with integer arithmetic
on the float32 bit pattern, without an FP8 dtype: XLA may delete an f32 -> fp8 -> f32
convert pair under jit, but never integer arithmetic, so it needs no optimization
barrier and fuses with neighbouring elementwise ops and reductions.
"""

from __future__ import annotations

import dataclasses

import jax
from jax import lax
import jax.numpy as jnp
import ml_dtypes
import numpy as np


@dataclasses.dataclass(frozen=True)
class FloatFormat:
  """Static facts about one element format.

  Attributes:
    name: canonical short name ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e4m3fnuz",
      "e5m2fnuz").
    dtype: the ml_dtypes scalar type (for example ``ml_dtypes.float4_e2m1fn``).
    storage_dtype: the dtype quantized payloads are stored in (``dtype``, or E4M3 for
      the FP6 formats, which XLA:CPU cannot convert to).
    max: largest finite value.
    min_normal: smallest positive normal value.
    min_subnormal: smallest positive subnormal value.
    mantissa_bits: explicit fraction bits.
    emax: exponent of ``max`` (floor(log2(max))).
    has_inf: whether the format encodes infinities.
    has_nan: whether the format encodes NaN.
    uniform: a uniform 4-bit grid without an ml_dtypes float type of its own (``e1m2``,
      ``int4``; :data:`UNIFORM_GRIDS`): every conversion rounds through
      :func:`round_to_format`, whose float32 values ``storage_dtype`` holds exactly.
  """

  name: str
  dtype: type
  storage_dtype: type
  max: float
  min_normal: float
  min_subnormal: float
  mantissa_bits: int
  emax: int
  has_inf: bool
  has_nan: bool
  uniform: bool = False

  @property
  def bits(self) -> int:
    """Bits per element (8, 6 or 4)."""
    return 4 if self.uniform else int(ml_dtypes.finfo(self.dtype).bits)




def _make(name: str, dtype: type, storage=None) -> FloatFormat:
  info = ml_dtypes.finfo(dtype)
  values = np.arange(2**info.bits, dtype=np.uint8).view(dtype).astype(np.float32)
  return FloatFormat(
      name=name,
      dtype=dtype,
      storage_dtype=storage or dtype,
      max=float(info.max),
      min_normal=float(info.smallest_normal),
      min_subnormal=float(info.smallest_subnormal),
      mantissa_bits=int(info.nmant),
      emax=int(np.floor(np.log2(float(info.max)))),
      has_inf=bool(np.isinf(values).any()),
      has_nan=bool(np.isnan(values).any()),
  )


FORMATS: dict[str, FloatFormat] = {
    "e4m3": _make("e4m3", ml_dtypes.float8_e4m3fn),
    "e5m2": _make("e5m2", ml_dtypes.float8_e5m2),
    "e2m3": _make("e2m3", ml_dtypes.float6_e2m3fn, ml_dtypes.float8_e4m3fn),
    "e3m2": _make("e3m2", ml_dtypes.float6_e3m2fn, ml_dtypes.float8_e4m3fn),
    "e2m1": _make("e2m1", ml_dtypes.float4_e2m1fn),
    "e4m3fnuz": _make("e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
    "e5m2fnuz": _make("e5m2fnuz", ml_dtypes.float8_e5m2fnuz),
    # Uniform 4-bit grids, 15 values each: sign and a 3-bit magnitude on a fixed step.
    # E1M2 as Huawei's en_dtypes float4_e1m2 (exponent bias 1): ±{0, 0.25, ..., 1.75},
    # subnormals 0.25-0.75, no inf or NaN; stored in E4M3, which holds every value.
    "e1m2": FloatFormat("e1m2", ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fn, max=1.75,
                        min_normal=1.0, min_subnormal=0.25, mantissa_bits=2, emax=0,
                        has_inf=False, has_nan=False, uniform=True),
    # INT4 on the symmetric range ±7 (a scaled block never reaches -8), stored as int4: the
    # grid of a float format with 2 mantissa bits whose normals [4, 7] and subnormals
    # [1, 3] share the step 1, which round_to_format then rounds exactly.
    "int4": FloatFormat("int4", ml_dtypes.int4, ml_dtypes.int4, max=7.0, min_normal=4.0,
                        min_subnormal=1.0, mantissa_bits=2, emax=2, has_inf=False,
                        has_nan=False, uniform=True),
}
UNIFORM_GRIDS = ("e1m2", "int4")
"""The uniform 4-bit grids (arXiv 2606.20381's E1M2/INT4): E1M2 = INT4 / 4, value for
value."""

_ALIASES = {
    "float8_e4m3fn": "e4m3",
    "e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
    "float6_e2m3fn": "e2m3",
    "e2m3fn": "e2m3",
    "float6_e3m2fn": "e3m2",
    "e3m2fn": "e3m2",
    "float4_e2m1fn": "e2m1",
    "float4_e1m2": "e1m2",
    "e2m1fn": "e2m1",
    "float8_e4m3fnuz": "e4m3fnuz",
    "float8_e5m2fnuz": "e5m2fnuz",
}


def canonical_format_name(name: str) -> str:
  """Returns the canonical short name for ``name`` (a string, or an ml_dtypes type or
  dtype) or raises ValueError (unknown name) or TypeError (not a name)."""
  if isinstance(name, np.dtype) or (isinstance(name, type) and issubclass(name, np.generic)):
    name = np.dtype(name).name
  if not isinstance(name, str):
    raise TypeError(f"format name must be a string such as 'e4m3', got "
                    f"{type(name).__name__} {name!r}")
  key = name.lower()
  key = _ALIASES.get(key, key)
  if key not in FORMATS:
    known = sorted(set(FORMATS) | set(_ALIASES))
    raise ValueError(f"unknown FP8 format {name!r}; known formats: {known}")
  return key


def get_format(name: str) -> FloatFormat:
  """Looks up a format by canonical name or ml_dtypes name."""
  return FORMATS[canonical_format_name(name)]


def saturating_cast(x: jnp.ndarray, fmt: FloatFormat | str) -> jnp.ndarray:
  """Rounds ``x`` to ``fmt`` (nearest-even), saturating finite overflow and ±inf.

  Args:
    x: float array of any shape (already multiplied by its scale).
    fmt: the target format, or its name (e.g. "e4m3").

  Returns:
    An array of ``fmt.storage_dtype`` with the shape of ``x``. NaN stays NaN where the
    storage type has it (E2M1 has not: mark such blocks NaN through their scale).
  """
  if not isinstance(fmt, FloatFormat):
    if not isinstance(fmt, str):
      raise TypeError(f"saturating_cast: fmt must be a FloatFormat or a format name such as "
                      f"'e4m3', got {type(fmt).__name__} {fmt!r}")
    try:
      fmt = get_format(fmt)
    except ValueError as e:
      raise ValueError(f"saturating_cast: fmt: {e}") from None
  if not isinstance(x, (jax.Array, np.ndarray, np.generic)):
    raise TypeError(f"saturating_cast: x must be a jax.Array or numpy.ndarray, got "
                    f"{type(x).__name__}")
  if fmt.uniform:  # E1M2, INT4: exact values; NaN, which they cannot hold, gives +0
    q = round_to_format(x, fmt)
    return jnp.where(jnp.isnan(q), 0.0, q).astype(fmt.storage_dtype)
  if fmt.storage_dtype is not fmt.dtype:  # FP6: exact values, stored in E4M3
    return round_to_format(x, fmt).astype(fmt.storage_dtype)
  return jnp.clip(x, -fmt.max, fmt.max).astype(fmt.dtype)


_SIGN_BIT = np.uint32(0x80000000)
_ABS_MASK = np.uint32(0x7FFFFFFF)
_F32_MANTISSA_BITS = 23
_F32_BIAS = 127


def round_to_format(x: jnp.ndarray, fmt: FloatFormat) -> jnp.ndarray:
  """``saturating_cast(x, fmt).astype(float32)``, computed without an FP8 dtype.

  Integer arithmetic on the float32 bit pattern: round to nearest even on the
  format's ``mantissa_bits`` in its normal range, to the fixed quantum
  ``min_subnormal`` below ``min_normal``, saturate to ±max (±inf included), keep NaN
  (the input NaN is returned unchanged) and the sign of zero (formats without a
  negative zero, the fnuz ones, give +0). Equal bit for bit to the cast for every
  float32 input (NaN payloads aside).

  Args:
    x: float32 array of any shape (already multiplied by its scale). Other float
      dtypes are converted to float32 first.
    fmt: the target format.

  Returns:
    float32 array shaped like ``x`` holding values representable in ``fmt``.
  """
  x = jnp.asarray(x).astype(jnp.float32)
  m = fmt.mantissa_bits
  emin = int(np.log2(fmt.min_normal))  # exponent of the smallest normal
  u32 = lambda v: np.uint32(v)
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  sign = bits & _SIGN_BIT
  mag = bits & _ABS_MASK
  # Normal range: round the bit pattern at bit `drop` (a mantissa bit, as drop <= 22),
  # nearest even; a carry runs into the exponent as it should. inf stays inf and
  # saturates below; the largest finite float32 values round to inf and saturate.
  drop = _F32_MANTISSA_BITS - m
  lsb = lax.shift_right_logical(mag, u32(drop)) & u32(1)
  normal = (mag + u32((1 << (drop - 1)) - 1) + lsb) & u32(~((1 << drop) - 1) & 0xFFFFFFFF)
  max_bits = int(np.array(fmt.max, np.float32).view(np.uint32))
  normal = jnp.minimum(normal, u32(max_bits))
  # Subnormal range (|x| < min_normal): k = round_even(|x| / min_subnormal) from the
  # 24-bit significand, then k * min_subnormal (exact). Shifts >= 25 give k = 0 (float32
  # subnormals and zero included); k = 2**m is min_normal itself.
  exponent = lax.shift_right_logical(mag, u32(_F32_MANTISSA_BITS)).astype(jnp.int32)
  significand = (mag & u32(0x007FFFFF)) | u32(0x00800000)
  extra = jnp.clip(emin + _F32_BIAS - exponent, 0, 25 - drop)
  shift = (extra + drop).astype(jnp.uint32)
  k_lsb = lax.shift_right_logical(significand, shift) & u32(1)
  half_minus_one = lax.shift_left(u32(1), shift - u32(1)) - u32(1)
  k = lax.shift_right_logical(significand + half_minus_one + k_lsb, shift)
  tiny = k.astype(jnp.int32).astype(jnp.float32) * np.float32(fmt.min_subnormal)
  tiny = lax.bitcast_convert_type(tiny, jnp.uint32)
  out = jnp.where(exponent < emin + _F32_BIAS, tiny, normal)
  if fmt.name.endswith("fnuz"):
    sign = jnp.where(out == u32(0), u32(0), sign)  # no negative zero
  out = lax.bitcast_convert_type(out | sign, jnp.float32)
  return jnp.where(jnp.isnan(x), x, out)


SR_BITS = (24, 8)
"""Random bits per element that stochastic rounding can use: 24 (the default, nearly ideal)
or 8 (Blackwell's ``cvt.rs.satfinite.e2m1x4.f32`` and Transformer Engine's software
fallback of it)."""


def _grid_step(a: jnp.ndarray, fmt: FloatFormat) -> jnp.ndarray:
  """The spacing of ``fmt``'s grid at the non-negative float32 ``a`` (a power of two:
  ``2**(max(floor(log2 a), emin) - mantissa_bits)``, the subnormal quantum below the
  smallest normal), as float32."""
  emin = int(np.log2(fmt.min_normal))
  exponent = lax.shift_right_logical(lax.bitcast_convert_type(a, jnp.uint32),
                                     np.uint32(_F32_MANTISSA_BITS)).astype(jnp.int32)
  step_exp = jnp.maximum(exponent - _F32_BIAS, emin) - fmt.mantissa_bits
  return lax.bitcast_convert_type((step_exp + _F32_BIAS) << _F32_MANTISSA_BITS, jnp.float32)


def stochastic_round_to_format(x: jnp.ndarray, fmt: FloatFormat, bits: jnp.ndarray,
                               sr_bits: int = 24) -> jnp.ndarray:
  """Stochastic rounding of ``x`` to ``fmt``'s values, as float32.

  Each |x| below ``fmt.max`` becomes one of its two neighbours on the format's grid,
  ``lo <= |x| <= hi``; grid values stay exact, |x| >= max and ±inf saturate to ±max, NaN
  stays NaN, the sign (of zero too) is kept. With ``f = (|x| - lo) / (hi - lo)``:

  * ``sr_bits=24``: ``t = |x| / ulp`` and its fraction are exact in float32 and are
    compared with a 24-bit uniform draw ``u`` (the top 24 bits of ``bits``): ``hi`` when
    ``u < f``, so ``P(hi) = ceil(2**24 f) / 2**24`` = ``f`` except for |x| below half the
    smallest subnormal, where it is resolved to 2**-24. ``E[result] = x``.
  * ``sr_bits=8``: the rounding of ``cvt.rs.satfinite.e2m1x4.f32`` as Transformer
    Engine's software fallback computes it (``stochastic_round_fp4_e2m1`` in
    ``transformer_engine/common/util/ptx.cuh``, NVIDIA/TransformerEngine commit
    fc1fc0e787fc4fe3b50c71e4a9e353c0593615ff, PR #3281), for any format: ``r`` = the low 8
    bits of ``bits`` (TE hands element ``i`` of four byte ``i`` of one 32-bit word),
    ``t = float32(|x| + (r / 256) * step(|x|))`` (one rounding, as ``fmaf``),
    ``result = min(floor(t / step(t)) * step(t), max)``, with ``step(v)`` the grid spacing
    at ``v``. The 8 bits are added just below the last kept mantissa bit and the sum is
    truncated, so ``P(hi) = floor(256 f) / 256``: rounding toward zero is favoured,
    ``E[|result|] - |x| = -step * (f - floor(256 f) / 256)``, between ``-step / 256`` and
    0 (few-bit stochastic rounding is biased; arXiv 2504.20634). The float32 rounding of
    ``t`` changes the result only where ``t`` falls within half a float32 ulp below a grid
    value of a higher binade than |x|: in E2M1, |x| = 2**-9 - 2**-30 with ``r = 255`` gives
    0.5 (exact arithmetic: 0), as TE does. TE maps a NaN to +max (satfinite); here NaN
    stays NaN, as with the other roundings, and the quantize ops mark its block NaN.

  Args:
    x: float32 array (other float dtypes are converted), already scaled.
    fmt: the target format.
    bits: uint32 random bits shaped like ``x`` (e.g. ``jax.random.bits``).
    sr_bits: 24 or 8 (:data:`SR_BITS`).

  Returns:
    float32 array shaped like ``x`` holding values representable in ``fmt``.
  """
  if sr_bits not in SR_BITS:
    raise ValueError(f"sr_bits must be one of {SR_BITS}, got {sr_bits!r}")
  x = jnp.asarray(x).astype(jnp.float32)
  a = jnp.abs(x)
  bits = bits.astype(jnp.uint32)
  if sr_bits == 8:
    u = (bits & np.uint32(0xFF)).astype(jnp.float32) * np.float32(2.0**-8)
    t = a + u * _grid_step(a, fmt)  # u * step is exact: one float32 rounding, as fmaf
    step_t = _grid_step(t, fmt)  # t may have crossed into the next binade
    mag = jnp.floor(t / step_t) * step_t  # exact: power-of-two divisions
  else:
    ulp = _grid_step(a, fmt)
    t = a / ulp  # exact: a power-of-two division
    lo = jnp.floor(t)
    u = lax.shift_right_logical(bits, np.uint32(8)).astype(jnp.float32) * np.float32(2.0**-24)
    mag = (lo + (u < t - lo).astype(jnp.float32)) * ulp
  mag = jnp.minimum(mag, np.float32(fmt.max))
  out = jnp.where(jnp.signbit(x), -mag, mag)
  return jnp.where(jnp.isnan(x), x, out)


def saturates(a: jax.Array, fmt) -> jax.Array:
  """|v| = ``a`` rounds past ``fmt.max``: above the midpoint between max and max +
  ulp(max), or on it when max's last mantissa bit is odd (ties to even go up). NaN:
  False."""
  half_ulp = 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
  mid = np.float32(fmt.max + half_ulp)  # exact: a float32 value
  odd = int(round(fmt.max / (2 * half_ulp))) % 2 == 1
  return (a >= mid) if odd else (a > mid)
