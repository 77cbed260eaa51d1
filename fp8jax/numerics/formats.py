"""FP8 element formats and the saturating cast.

The formats are the ml_dtypes 8-bit floats. A plain ``astype`` to e4m3fn turns any
value above ~464 into NaN and e5m2 turns values above ~61440 into inf, so every cast
in fp8jax goes through :func:`saturating_cast`, which clips to ±max first.

Non-finite inputs follow the PTX ``cvt.rn.satfinite`` conversion: NaN stays NaN and
±inf saturates to ±max (so a quantized tensor never holds inf, even in e5m2).

:func:`round_to_format` computes the float32 value of that cast with integer arithmetic
on the float32 bit pattern, without an FP8 dtype: XLA may delete an f32 -> fp8 -> f32
convert pair under jit, but never integer arithmetic, so it needs no optimization
barrier and fuses with neighbouring elementwise ops and reductions.
"""

from __future__ import annotations

import dataclasses

from jax import lax
import jax.numpy as jnp
import ml_dtypes
import numpy as np


@dataclasses.dataclass(frozen=True)
class Fp8Format:
  """Static facts about one 8-bit float format.

  Attributes:
    name: canonical short name ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz").
    dtype: the ml_dtypes scalar type (for example ``ml_dtypes.float8_e4m3fn``).
    max: largest finite value.
    min_normal: smallest positive normal value.
    min_subnormal: smallest positive subnormal value.
    mantissa_bits: explicit fraction bits.
    emax: exponent of ``max`` (floor(log2(max))).
  """

  name: str
  dtype: type
  max: float
  min_normal: float
  min_subnormal: float
  mantissa_bits: int
  emax: int


def _make(name: str, dtype: type) -> Fp8Format:
  info = ml_dtypes.finfo(dtype)
  return Fp8Format(
      name=name,
      dtype=dtype,
      max=float(info.max),
      min_normal=float(info.smallest_normal),
      min_subnormal=float(info.smallest_subnormal),
      mantissa_bits=int(info.nmant),
      emax=int(np.floor(np.log2(float(info.max)))),
  )


FORMATS: dict[str, Fp8Format] = {
    "e4m3": _make("e4m3", ml_dtypes.float8_e4m3fn),
    "e5m2": _make("e5m2", ml_dtypes.float8_e5m2),
    "e4m3fnuz": _make("e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
    "e5m2fnuz": _make("e5m2fnuz", ml_dtypes.float8_e5m2fnuz),
}

_ALIASES = {
    "float8_e4m3fn": "e4m3",
    "e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3fnuz",
    "float8_e5m2fnuz": "e5m2fnuz",
}


def canonical_format_name(name: str) -> str:
  """Returns the canonical short name for ``name`` or raises ValueError."""
  key = str(name).lower()
  key = _ALIASES.get(key, key)
  if key not in FORMATS:
    known = sorted(set(FORMATS) | set(_ALIASES))
    raise ValueError(f"unknown FP8 format {name!r}; known formats: {known}")
  return key


def get_format(name: str) -> Fp8Format:
  """Looks up a format by canonical name or ml_dtypes name."""
  return FORMATS[canonical_format_name(name)]


def saturating_cast(x: jnp.ndarray, fmt: Fp8Format) -> jnp.ndarray:
  """Rounds ``x`` to ``fmt`` (nearest-even), saturating finite overflow and ±inf.

  Args:
    x: float array of any shape (already multiplied by its scale).
    fmt: the target format.

  Returns:
    An array of ``fmt.dtype`` with the shape of ``x``. NaN stays NaN.
  """
  return jnp.clip(x, -fmt.max, fmt.max).astype(fmt.dtype)


_SIGN_BIT = np.uint32(0x80000000)
_ABS_MASK = np.uint32(0x7FFFFFFF)
_F32_MANTISSA_BITS = 23
_F32_BIAS = 127


def round_to_format(x: jnp.ndarray, fmt: Fp8Format) -> jnp.ndarray:
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
