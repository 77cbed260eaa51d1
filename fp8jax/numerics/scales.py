"""Scales: amax -> quantization multiplier ``s`` and ``scale_inv = 1/s``, and their
application (:func:`apply_scales`, the elementwise round trip for given scales).

Power-of-two scales are built with exponent-bit arithmetic on the float32 bit
pattern. Every scale and its reciprocal is a normal float32 in [2**-126, 2**126]:
XLA:CPU flushes float32 subnormals to zero, so a subnormal scale would silently zero
a block there. ``astype(float8_e8m0fnu)`` is NOT used for rounding: it rounds to nearest and
maps 0 to NaN. It is only used to *store* values that are already powers of two.

Two-level scales (``scale_format="e4m3"``, NVFP4; arXiv 2509.25149 and Transformer
Engine's NVFP4 recipe), with ``e = elem_max`` (6 for E2M1), ``G`` the tensor's largest
magnitude over its blocks free of NaN and inf, and every operation rounded to float32::

    S_enc = clip(448 * e / max(G, eps), 2**-126, 2**126)   (1 when G = 0)
    D     = 1 / S_enc                                       # tensor_scale_inv
    sd_b  = e4m3(min(amax_b * (S_enc * (1 / e)), 448))      # scale_inv, per block
    s_b   = min(1 / (sd_b * D), FLT_MAX)                    # the multiplier
    x_hat = (round(x * s_b) * sd_b) * D

``scale_format="ue5m3"`` (Transformer Engine PR #3325) takes UE5M3 block scales instead:
448 becomes UE5M3's largest value 114688 in ``S_enc`` and in the clamp, and ``e4m3``
becomes the UE5M3 rounding (``fp8jax.numerics.ue5m3``); everything else is the same, as
in TE's ``compute_global_encode_scaling_factor_FP4<ScaleType>`` and
``compute_decoding_scaling_factor<ScaleType>``.

Row-scaled two-level scales (``QuantSpec(row_scaled=True)``; TE's ``row_scaled_nvfp4``,
PR #2931, ``reference_nvfp4.py``): ``G``, ``S_enc`` and ``D`` are taken per row, a row
being the blocks of one line along the tile's axis (one token of an activation [..., K]
tiled along K), so ``tensor_scale_inv`` has the shape of the block grid with the tile's
axis of size 1. Each row is then quantized as a tensor of its own.

Non-finite blocks: a block holding NaN or ±inf has amax +inf
(``fp8jax.numerics.blocks.amax_abs``) and gets ``s = 1`` and a NaN ``scale_inv``, so the
whole block dequantizes to NaN and every GEMM output it enters is NaN: an overflow is
never hidden by quantization. This is what an OCP MX NaN scale (E8M0 0xFF) means, and
what the OCP reference library and torchao's MX conversion do with a NaN or inf block
maximum (docs/formats.md, "Conformance"). The payload keeps the saturating cast.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.numerics import arguments, formats, ue5m3
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
  v = arguments.float_array(v, "v", "round_pow2")
  bits = lax.bitcast_convert_type(v.astype(jnp.float32), jnp.int32)
  exponent = (bits >> 23) & 0xFF
  if rounding == "ceil":
    exponent = exponent + ((bits & _MANTISSA_MASK) != 0).astype(jnp.int32)
  elif rounding != "floor":
    raise ValueError(f"unknown power-of-two rounding {rounding!r}")
  exponent = jnp.clip(exponent, 1, 253)
  return lax.bitcast_convert_type(exponent << 23, jnp.float32)


def _exponent_pow2(biased: jnp.ndarray) -> jnp.ndarray:
  """2**(biased - 127) as float32, the biased exponent clamped to [1, 253]."""
  return lax.bitcast_convert_type(jnp.clip(biased, 1, 253) << 23, jnp.float32)


def _rceil_scale_inv(amax: jnp.ndarray, elem_max: float, margin: int) -> jnp.ndarray:
  """2**ceil(log2(amax * 2**margin / elem_max)) for normal float32 ``amax`` > 0.

  With ``amax = m * 2**e`` (1 <= m < 2), the quotient ``m / elem_max`` is a normal float32,
  rounded as ``amax / elem_max`` is wherever that is normal; ``e`` and ``margin`` are then
  added as exponents. A float32 quotient below 2**-126 would flush to zero on XLA:CPU
  (and lose the margin: amax 4.6e-34 in E5M2 with margin 1 gave 2**-126, not 2**-125).
  """
  bits = lax.bitcast_convert_type(amax, jnp.int32)
  mantissa = lax.bitcast_convert_type((bits & _MANTISSA_MASK) | (127 << 23), jnp.float32)
  q = lax.bitcast_convert_type(mantissa / jnp.float32(elem_max), jnp.int32)
  biased = ((q >> 23) & 0xFF) + ((q & _MANTISSA_MASK) != 0).astype(jnp.int32)
  return _exponent_pow2(biased + ((bits >> 23) & 0xFF) - 127 + margin)


OAS_CONSTANTS = {"e2m1": 12.0 / 7.0, "e4m3": 60.0 / 31.0}
"""The constant ``C`` of the OAS scale rule per element format (qwix, commit 901efed:
MXFP4 ``2**(0.5 - log2(7/6) + 0.5) = 12/7``, MXFP8 ``2**(0.5 - log2(31/30) + 0.5) =
60/31``)."""


def _oas_scale_inv(amax: jnp.ndarray, fmt: formats.FloatFormat, margin: int) -> jnp.ndarray:
  """OAS, overflow-aware power-of-two scales (arXiv 2603.08713; google/qwix commit
  901efed, ``qarray.compute_scale_zero_point``): ``2**floor(log2(bf16(amax / max * C)))``,
  the product rounded to bfloat16 (nearest even) before its exponent is kept, for normal
  float32 ``amax`` > 0. With ``amax = m * 2**e``, ``m / max * C`` is computed and ``e`` added
  as an exponent, which equals qwix's float32 ``amax / max * C`` wherever that is normal
  (see :func:`_rceil_scale_inv`)."""
  bits = lax.bitcast_convert_type(amax, jnp.int32)
  mantissa = lax.bitcast_convert_type((bits & _MANTISSA_MASK) | (127 << 23), jnp.float32)
  p = (mantissa / jnp.float32(fmt.max)) * jnp.float32(OAS_CONSTANTS[fmt.name])
  pb = lax.bitcast_convert_type(p, jnp.int32)
  rounded = pb + 0x7FFF + ((pb >> 16) & 1)  # to bfloat16, ties to even; carries to 2**k
  biased = (rounded >> 23) & 0xFF
  return _exponent_pow2(biased + ((bits >> 23) & 0xFF) - 127 + margin)


def mark_nonfinite(s: jnp.ndarray, scale_inv: jnp.ndarray,
                   amax: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
  """``(s, scale_inv)`` with ``s = 1`` and ``scale_inv = NaN`` where ``amax`` is not
  finite (a block holding NaN or ±inf: see the module docstring)."""
  bad = ~jnp.isfinite(amax)
  return (jnp.where(bad, jnp.float32(1.0), s),
          jnp.where(bad, jnp.float32(jnp.nan), scale_inv))


def compute_scale(amax: jnp.ndarray,
                  spec: spec_lib.QuantSpec) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Scales for blocks whose largest magnitude is ``amax`` (one-level specs).

  Args:
    amax: float array (any shape) of per-block amax values, >= 0; +inf (or NaN) marks a
      block holding a non-finite value, whose ``scale_inv`` is NaN. Float32 subnormals
      count as 0 on every platform.
    spec: the quantization spec (format, eps, margin, scale format); two-level
      (``"e4m3"``, ``"ue5m3"``) specs need :func:`compute_scales`.

  Returns:
    ``(s, scale_inv)``, float32 arrays shaped like ``amax``: quantize with
    ``x * s``, dequantize with ``q * scale_inv``.
  """
  amax = arguments.float_array(amax, "amax", "compute_scale")
  spec = arguments.quant_spec(spec, "spec", "compute_scale")
  if spec.two_level:
    raise ValueError(f"two-level {spec.scale_format} scales need compute_scales (a "
                     "per-tensor level too)")
  raw = amax.astype(jnp.float32)
  amax = jnp.maximum(jnp.where(jnp.isfinite(raw), raw, 0.0), jnp.float32(spec.eps))
  amax = jnp.where(amax >= jnp.float32(_FP32_SCALE_MIN), amax, 0.0)
  # fp8_max * 2**-margin is exact.
  target = jnp.float32(spec.fmt.max * 2.0**-spec.margin)
  if spec.scale_format == "pow2" and spec.pow2_rounding == "rceil":
    scale_inv = _rceil_scale_inv(amax, spec.fmt.max, spec.margin)
    s = 1.0 / scale_inv
  elif spec.scale_format == "pow2" and spec.pow2_rounding == "oas":
    scale_inv = _oas_scale_inv(amax, spec.fmt, spec.margin)
    s = 1.0 / scale_inv
  elif spec.scale_format == "pow2" and spec.pow2_rounding == "ocp":
    biased = (lax.bitcast_convert_type(amax, jnp.int32) >> 23) & 0xFF
    scale_inv = _exponent_pow2(biased - spec.fmt.emax + spec.margin)
    s = 1.0 / scale_inv
  elif spec.scale_format == "pow2":
    s = round_pow2(target / amax, spec.pow2_rounding)
  else:
    s = jnp.clip(target / amax, _FP32_SCALE_MIN, _FP32_SCALE_MAX)
  s = jnp.where(amax > 0, s, jnp.float32(1.0))
  return mark_nonfinite(s, 1.0 / s, raw)


_E4M3_MAX = 448.0
_FLT_MAX = float(jnp.finfo(jnp.float32).max)


def block_scale_max(spec: spec_lib.QuantSpec) -> float:
  """The largest block scale of a two-level spec: 448 (E4M3) or 114688 (UE5M3)."""
  return ue5m3.MAX if spec.scale_format == "ue5m3" else _E4M3_MAX


def block_scale_min_normal(spec: spec_lib.QuantSpec) -> float:
  """The smallest normal block scale of a two-level spec: 2**-6 (E4M3) or 2**-14 (UE5M3)."""
  return ue5m3.MIN_NORMAL if spec.scale_format == "ue5m3" else 2.0**-6


def round_block_scales(v: jnp.ndarray, spec: spec_lib.QuantSpec) -> jnp.ndarray:
  """float32 block scales ``v`` (>= 0, at most :func:`block_scale_max`) rounded to the
  spec's block-scale format (E4M3 or UE5M3, nearest even), as float32."""
  if spec.scale_format == "ue5m3":
    return ue5m3.round_to_ue5m3(v)
  return formats.round_to_format(v, formats.get_format("e4m3"))


def level_amax(amax: jnp.ndarray, spec: spec_lib.QuantSpec,
               blocked: bool = False) -> jnp.ndarray:
  """``G`` of two-level scales: the largest finite entry of the per-block ``amax`` (+inf
  and NaN blocks skipped), over the tensor (a float32 scalar) or, with
  ``spec.row_scaled``, over each row, kept as a size-1 axis.

  Args:
    amax: float per-block amax of one tensor: shaped like its block grid, or with
      ``blocked`` in the blocked layout ``[n0, 1, n1, 1, ...]`` (``blocks.split_blocks``
      reduced with keepdims).
    spec: a two-level spec.
    blocked: ``amax`` is in the blocked layout.
  """
  raw = amax.astype(jnp.float32)
  finite = jnp.where(jnp.isfinite(raw), raw, 0.0)
  if not spec.row_scaled:
    return jnp.max(finite, initial=0.0)
  rank = raw.ndim // 2 if blocked else raw.ndim
  axis = spec.granularity.axes[0] % rank
  return jnp.max(finite, axis=2 * axis if blocked else axis, keepdims=True, initial=0.0)


def compute_scales(amax: jnp.ndarray, spec: spec_lib.QuantSpec,
                   tensor_amax: jnp.ndarray | None = None, blocked: bool = False):
  """Scales for blocks whose largest magnitudes are ``amax``, any spec.

  Args:
    amax: float array of the per-block amax values of ONE tensor (any shape; row-scaled
      specs: the block grid, or the blocked layout with ``blocked``): the two-level rule
      takes the tensor's (row's) amax as the maximum of the finite ones; +inf marks a
      non-finite block (NaN ``scale_inv``).
    spec: the quantization spec.
    tensor_amax: the tensor's amax (per row: broadcastable to ``amax``) when ``amax``
      holds only some of its blocks (a kernel's tile); None: :func:`level_amax` (blocks
      holding NaN or inf are NaN as a whole and do not set the tensor scale).
    blocked: ``amax`` is in the blocked layout (see :func:`level_amax`).

  Returns:
    ``(s, scale_inv, tensor_scale_inv)``: float32 arrays shaped like ``amax`` (quantize
    with ``x * s``, dequantize with ``q * scale_inv * tensor_scale_inv``) and, for
    two-level specs, float32 ``tensor_scale_inv`` (a scalar; per row for row-scaled
    specs, ``amax``'s shape with the tile's axis 1), None for the others.
  """
  spec = arguments.quant_spec(spec, "spec", "compute_scales")
  if not spec.two_level:
    return (*compute_scale(amax, spec), None)
  raw = arguments.float_array(amax, "amax", "compute_scales").astype(jnp.float32)
  amax = jnp.where(jnp.isfinite(raw), raw, 0.0)
  elem_max = spec.fmt.max
  top = block_scale_max(spec)
  g = level_amax(raw, spec, blocked) if tensor_amax is None else tensor_amax.astype(
      jnp.float32)
  g = jnp.maximum(g, jnp.float32(spec.eps))
  s_enc = jnp.clip(jnp.float32(top * elem_max) / g, _FP32_SCALE_MIN, _FP32_SCALE_MAX)
  s_enc = jnp.where(g > 0, s_enc, jnp.float32(1.0))
  tensor_scale_inv = 1.0 / s_enc
  multiplier = s_enc * jnp.float32(1.0 / elem_max)
  block = jnp.minimum(amax * multiplier, jnp.float32(top))
  scale_inv = round_block_scales(block, spec)
  s = jnp.minimum(1.0 / (scale_inv * tensor_scale_inv), jnp.float32(_FLT_MAX))
  return (*mark_nonfinite(s, scale_inv, raw), tensor_scale_inv)


def round_elements(v: jnp.ndarray, fmt: formats.FloatFormat,
                   bits: jnp.ndarray | None = None, sr_bits: int = 24) -> jnp.ndarray:
  """Scaled float32 values rounded to ``fmt`` (as float32): to nearest even, or
  stochastically with uint32 ``bits`` shaped like ``v``, of which ``sr_bits`` (24 or 8)
  are used per element (``formats.stochastic_round_to_format``)."""
  if bits is None:
    return formats.round_to_format(v, fmt)
  return formats.stochastic_round_to_format(v, fmt, bits, sr_bits)


def apply_scales(x: jax.Array, s: jax.Array, scale_inv: jax.Array,
                 fmt: formats.FloatFormat, dtype, tensor_scale_inv: jax.Array | None = None,
                 bits: jax.Array | None = None, sr_bits: int = 24) -> jax.Array:
  """The elementwise round trip for given scales.

  ``round(float32(x) * s) * scale_inv [* tensor_scale_inv]`` (nearest even, or
  stochastic with ``bits``), clipped to the largest finite value of ``dtype`` (NaN
  kept, also on backends whose min/max drop NaN) and cast to ``dtype``.

  Args:
    x: float array, any shape.
    s: float32 quantization multipliers broadcastable to ``x``.
    scale_inv: float32 dequantization multipliers broadcastable to ``x``.
    fmt: the element format.
    dtype: output dtype.
    tensor_scale_inv: the second (per-tensor) level of two-level scales, or None.
    bits: uint32 random bits shaped like ``x`` for stochastic rounding, or None.
    sr_bits: random bits per element that stochastic rounding uses (24 or 8).

  Returns:
    ``x_hat`` of ``dtype`` with the broadcast shape of ``x`` and the scales.
  """
  dtype = jnp.dtype(dtype)
  q = round_elements(x.astype(jnp.float32) * s, fmt, bits, sr_bits)
  out = q * scale_inv
  if tensor_scale_inv is not None:
    out = out * tensor_scale_inv
  top = float(jnp.finfo(dtype).max)
  out = jnp.where(jnp.isnan(out), out, jnp.clip(out, -top, top))
  return out.astype(dtype)
