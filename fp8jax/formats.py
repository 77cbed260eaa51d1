"""FP8 element formats and the saturating cast.

The formats are the ml_dtypes 8-bit floats. A plain ``astype`` to e4m3fn turns any
value above ~464 into NaN and e5m2 turns values above ~61440 into inf, so every cast
in fp8jax goes through :func:`saturating_cast`, which clips to ±max first.

Non-finite inputs follow the PTX ``cvt.rn.satfinite`` conversion: NaN stays NaN and
±inf saturates to ±max (so a quantized tensor never holds inf, even in e5m2).
"""

from __future__ import annotations

import dataclasses

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
