"""Scales: amax -> quantization multiplier ``s`` and ``scale_inv = 1/s``, and their
application (:func:`apply_scales`, the elementwise round trip for given scales).

Power-of-two scales are built with exponent-bit arithmetic on the float32 bit
pattern. Every scale and its reciprocal is a normal float32 in [2**-126, 2**126]:
XLA:CPU flushes float32 subnormals to zero, so a subnormal scale would silently zero
a block there. ``astype(float8_e8m0fnu)`` is NOT used for rounding: it rounds to nearest and
maps 0 to NaN. It is only used to *store* values that are already powers of two.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.numerics import formats
from fp8jax.numerics import spec as spec_lib

_MANTISSA_MASK = 0x007FFFFF
_FP32_SCALE_MIN = 2.0**-126
_FP32_SCALE_MAX = 2.0**126


def round_pow2(v: jnp.ndarray, rounding: str) -> jnp.ndarray:
  """Rounds positive float32 ``v`` to a power of two by exponent arithmetic.

  Args:
    v: float32 array of values >= 0 (inf allowed).
    rounding: "floor" keeps the exponent, "ceil" bumps it when the mantissa is
      non-zero.

  Returns:
    float32 powers of two; the biased exponent is clamped to [1, 253], so results
    lie in [2**-126, 2**126] and so do their reciprocals (0 and subnormals go to
    2**-126, inf to 2**126).
  """
  bits = lax.bitcast_convert_type(v.astype(jnp.float32), jnp.int32)
  exponent = (bits >> 23) & 0xFF
  if rounding == "ceil":
    exponent = exponent + ((bits & _MANTISSA_MASK) != 0).astype(jnp.int32)
  elif rounding != "floor":
    raise ValueError(f"unknown power-of-two rounding {rounding!r}")
  exponent = jnp.clip(exponent, 1, 253)
  return lax.bitcast_convert_type(exponent << 23, jnp.float32)


def compute_scale(amax: jnp.ndarray,
                  spec: spec_lib.QuantSpec) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Scales for blocks whose largest finite magnitude is ``amax``.

  Args:
    amax: float array (any shape) of per-block amax values, >= 0.
    spec: the quantization spec (format, eps, margin, scale format).

  Returns:
    ``(s, scale_inv)``, float32 arrays shaped like ``amax``: quantize with
    ``x * s``, dequantize with ``q * scale_inv``.
  """
  amax = jnp.maximum(amax.astype(jnp.float32), jnp.float32(spec.eps))
  # fp8_max * 2**-margin is exact; dividing amax by fp8_max first cannot overflow.
  target = jnp.float32(spec.fmt.max * 2.0**-spec.margin)
  if spec.scale_format == "pow2" and spec.pow2_rounding == "rceil":
    scale_inv = round_pow2(amax / jnp.float32(spec.fmt.max) * jnp.float32(2.0**spec.margin),
                           "ceil")
    s = 1.0 / scale_inv
  elif spec.scale_format == "pow2":
    s = round_pow2(target / amax, spec.pow2_rounding)
  else:
    s = jnp.clip(target / amax, _FP32_SCALE_MIN, _FP32_SCALE_MAX)
  s = jnp.where(amax > 0, s, jnp.float32(1.0))
  return s, 1.0 / s


def apply_scales(x: jax.Array, s: jax.Array, scale_inv: jax.Array, fmt: formats.Fp8Format,
                 dtype) -> jax.Array:
  """The elementwise round trip for given scales.

  ``round_to_format(float32(x) * s) * scale_inv``, clipped to the largest finite value
  of ``dtype`` (NaN kept, also on backends whose min/max drop NaN) and cast to ``dtype``.

  Args:
    x: float array, any shape.
    s: float32 quantization multipliers broadcastable to ``x``.
    scale_inv: float32 dequantization multipliers (``1 / s``) broadcastable to ``x``.
    fmt: the FP8 element format.
    dtype: output dtype.

  Returns:
    ``x_hat`` of ``dtype`` with the broadcast shape of ``x`` and the scales.
  """
  dtype = jnp.dtype(dtype)
  q = formats.round_to_format(x.astype(jnp.float32) * s, fmt)
  out = q * scale_inv
  top = float(jnp.finfo(dtype).max)
  out = jnp.where(jnp.isnan(out), out, jnp.clip(out, -top, top))
  return out.astype(dtype)
