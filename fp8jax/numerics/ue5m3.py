"""UE5M3: the unsigned 8-bit block-scale format of NVFP4 with UE5M3 scales.

Transformer Engine's prototype (NVIDIA/TransformerEngine PR #3325, "Prototype NVFP4 with
FP8 UE5M3 block scales", head b47e1f88b71134da6853d42c57ad5810f9802e68; its
``DType::kFloat8UE5M3`` is CUDA 13.4's ``__nv_fp8_ue5m3``) stores NVFP4's per-block
decode scales in UE5M3 instead of E4M3: no sign bit, 5 exponent bits with bias 15, 3
mantissa bits. As ``cuda_fp8.hpp`` (CUDA 13.5.37) defines it:

=============  ============================================================
code           value
=============  ============================================================
``0x00``       0
``0x01-0x07``  subnormals ``m / 8 * 2**-14``, from 2**-17 (``0x01``)
``0x08-0xFE``  normals ``(1 + m / 8) * 2**(e - 15)``, 2**-14 up to
               ``1.75 * 2**16`` = 114688 (``0xFE``)
``0xFF``       NaN (the only NaN; there is no infinity)
=============  ============================================================

The conversion TE uses (``static_cast<fp8ue5m3>(float)``, ``__nv_cvt_float_to_ue5m3``
with ``__NV_SATFINITE`` and ``cudaRoundNearest``) rounds to nearest even, saturates
finite values past the largest one and +inf to 114688, maps NaN to ``0xFF``, and drops
the sign of a negative input (it converts |x|). UE5M3 spans 2**-17 to 114688, about 34
binades where E4M3 spans 18 (2**-9 to 448), which is what lets a recipe drop the
per-tensor scale (arXiv 2609.02846). The two-level scale rule with it is in
``fp8jax.numerics.scales``: the tensor level maps the tensor's amax to ``6 * 114688``.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from fp8jax.numerics import formats

MAX = 114688.0
"""The largest UE5M3 value, ``1.75 * 2**16`` (code ``0xFE``)."""
MIN_SUBNORMAL = 2.0**-17
MIN_NORMAL = 2.0**-14
NAN_CODE = 0xFF
_BIAS = 15

FORMAT = formats.FloatFormat(
    name="ue5m3", dtype=np.uint8, storage_dtype=np.float32, max=MAX, min_normal=MIN_NORMAL,
    min_subnormal=MIN_SUBNORMAL, mantissa_bits=3, emax=16, has_inf=False, has_nan=True)
"""UE5M3 as a :class:`~fp8jax.numerics.formats.FloatFormat` for
:func:`~fp8jax.numerics.formats.round_to_format` (a scale format, not an element format:
it is not in ``formats.FORMATS``; its values are held in float32)."""


def round_to_ue5m3(v: jax.Array) -> jax.Array:
  """float32 ``v`` rounded to UE5M3's values, as float32: nearest even, saturating at
  114688 (+inf included), NaN kept, the sign dropped (|v| converts, as CUDA's cast)."""
  return formats.round_to_format(jnp.abs(jnp.asarray(v).astype(jnp.float32)), FORMAT)


def encode(v: jax.Array) -> jax.Array:
  """float32 ``v`` -> uint8 UE5M3 codes (:func:`round_to_ue5m3` first, NaN ``0xFF``)."""
  r = round_to_ue5m3(v)
  bits = lax.bitcast_convert_type(jnp.where(jnp.isnan(r), 0.0, r), jnp.uint32)
  exponent = (bits >> 23).astype(jnp.int32) - 127 + _BIAS  # biased UE5M3 exponent
  normal = (exponent << 3) | ((bits >> 20) & 7).astype(jnp.int32)
  sub = jnp.round(r / np.float32(MIN_SUBNORMAL)).astype(jnp.int32)  # exact: k * 2**-17
  code = jnp.where(r >= np.float32(MIN_NORMAL), normal, sub)
  return jnp.where(jnp.isnan(r), NAN_CODE, code).astype(jnp.uint8)


def decode(codes: jax.Array) -> jax.Array:
  """uint8 UE5M3 codes -> float32 values (``0xFF`` NaN)."""
  c = jnp.asarray(codes).astype(jnp.int32)
  e, m = c >> 3, (c & 7).astype(jnp.float32)
  scale = lax.bitcast_convert_type((jnp.maximum(e, 1) - _BIAS + 127) << 23, jnp.float32)
  value = jnp.where(e == 0, m * np.float32(1 / 8), 1.0 + m * np.float32(1 / 8)) * scale
  return jnp.where(c == NAN_CODE, jnp.float32(jnp.nan), value)


__all__ = ["FORMAT", "MAX", "MIN_NORMAL", "MIN_SUBNORMAL", "NAN_CODE", "decode", "encode",
           "round_to_ue5m3"]
