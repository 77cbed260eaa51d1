"""Fused fake quantization: ``x -> x_hat`` without materializing an FP8 payload.

:func:`fp8jax.quantize_dequantize` builds the FP8 payload and passes it through
``lax.optimization_barrier`` so that XLA cannot delete the f32 -> fp8 -> f32 converts;
the payload is then written to memory and ``x`` is read twice. When only ``x_hat`` is
needed, :func:`quantize_dequantize_fused` rounds with
:func:`fp8jax.numerics.formats.round_to_format` (integer arithmetic on the float32 bits,
which XLA cannot remove), so the block amax, the scales and the elementwise round trip can
fuse into as little as one pass over ``x``. The result is equal bit for bit to
``quantize_dequantize(x, spec)``.

The tensor is viewed as ``[n_0, b_0, n_1, b_1, ...]`` (``n_i`` blocks of size ``b_i``
along axis ``i``) and reduced over the ``b`` axes with ``keepdims``, so the scales
broadcast back without a gather. Shapes that the block does not divide are padded with
zeros, which never raise an amax, and cut back afterwards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp8jax.numerics import blocks, four_over_six, scales
from fp8jax.numerics import spec as spec_lib
from fp8jax.quant import rounding_bits


def supports(spec: spec_lib.QuantSpec) -> bool:
  """Whether :func:`quantize_dequantize_fused` handles ``spec``: current scaling, any
  granularity, format and scale rule (delayed scaling needs an amax history; a noise
  control and MS-EDEN, whose scales depend on the rounding, take the payload path)."""
  return spec.scaling == "current" and not spec.noise_control and spec.rounding != "ms_eden"


def quantize_dequantize_fused(x: jax.Array, spec: spec_lib.QuantSpec,
                              key: jax.Array | None = None) -> jax.Array:
  """Fake-quantizes ``x`` (forward value only), equal to ``quantize_dequantize(x, spec)``.

  Args:
    x: float32, bfloat16 or float16 array of shape ``S`` (any rank).
    spec: a current-scaling spec (see :func:`supports`); FP32, power-of-two or two-level
      scales, any granularity and format, either rounding.
    key: PRNG key for stochastic rounding (None: derived from ``x``, as in
      ``fp8jax.quantize``).

  Returns:
    ``x_hat`` of shape ``S`` and the dtype of ``x``. It has no meaningful derivative
    (the rounding's is zero, the scales' is not): differentiate through
    :func:`fp8jax.fake_quant`, which uses this function for its values.
  """
  if not supports(spec):
    raise ValueError(f"the fused round trip needs current scaling; got {spec.describe()}")
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating) or jnp.dtype(x.dtype).itemsize == 1:
    raise TypeError(f"quantize needs a 16- or 32-bit float input, got dtype {x.dtype}")
  shape = tuple(x.shape)
  block = spec.granularity.block_shape(shape)
  xs, inner, padded = blocks.split_blocks(x, block)
  amax = jnp.max(blocks.amax_abs(xs), axis=inner, keepdims=True, initial=0.0)
  if spec.four_over_six:  # the scale of each block chosen by its error
    s, scale_inv, tensor_scale_inv, _ = four_over_six.choose_scales(xs, amax, spec, inner)
  else:
    s, scale_inv, tensor_scale_inv = scales.compute_scales(amax, spec, blocked=True)
  bits = rounding_bits.rounding_bits(x, spec, key)
  if bits is not None:
    bits = blocks.split_blocks(bits, block)[0]
  out = scales.apply_scales(xs, s, scale_inv, spec.fmt, x.dtype, tensor_scale_inv,
                            bits, spec.sr_bits).reshape(padded)
  if padded != shape:
    out = out[tuple(slice(0, d) for d in shape)]
  return out


__all__ = ["quantize_dequantize_fused", "supports"]
