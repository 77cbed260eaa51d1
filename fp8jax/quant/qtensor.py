"""`quantize` / `dequantize` and the `QTensor` container.

Inputs may be float32, bfloat16 or float16 of any shape; the scaled values are formed
in float32 (``x.astype(f32) * s``) and cast once to FP8 with saturation.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from fp8jax.numerics import blocks, formats, scales
from fp8jax.numerics import spec as spec_lib
from fp8jax.quant import delayed
from fp8jax.quant import telemetry as telemetry_lib


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["data", "scale_inv"],
    meta_fields=["block", "dtype"])
@dataclasses.dataclass(frozen=True)
class QTensor:
  """An FP8 payload with its per-block dequantization multipliers.

  ``x ≈ data * broadcast(scale_inv)``.

  Attributes:
    data: FP8 array of the original shape ``S``.
    scale_inv: float32 (or float8_e8m0fnu) array of shape ``ceil(S / block)``.
    block: block shape aligned to the trailing axes of ``data``; leading axes not
      covered (for example those added by ``jax.vmap`` with the default
      ``out_axes=0``; other ``out_axes`` are not supported) have block size 1.
    dtype: dtype that ``dequantize`` returns by default (the input's dtype).
  """

  data: jax.Array
  scale_inv: jax.Array
  block: tuple[int, ...]
  dtype: np.dtype

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.data.shape)

  @property
  def full_block(self) -> tuple[int, ...]:
    """The block shape with one entry per axis of ``data``."""
    return blocks.align_block(self.block, self.data.ndim)


def _check_input(x: jax.Array) -> None:
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"quantize needs a floating-point input, got dtype {x.dtype}")
  if jnp.dtype(x.dtype).itemsize == 1:
    raise TypeError(f"input is already 8-bit ({x.dtype}); dequantize it first")


def _scales(x, spec, history):
  """Per-block ``(s, scale_inv)`` of shape ``num_blocks`` and the block shape."""
  block = spec.granularity.block_shape(x.shape)
  amax = blocks.block_amax(x, block)
  if spec.scaling == "delayed":
    delayed.check_history(history, spec, "forward")
    s, scale_inv = delayed.history_scale(
        delayed.as_float32(history), spec, jnp.max(amax, initial=0.0))
    s, scale_inv = (jnp.broadcast_to(v, amax.shape) for v in (s, scale_inv))
  else:
    if history is not None:
      raise ValueError(f"spec {spec.describe()} uses current scaling; it takes no history")
    s, scale_inv = scales.compute_scale(amax, spec)
  return block, s, scale_inv


def quantize_with_scaled(x: jax.Array, spec: spec_lib.QuantSpec,
                         history: jax.Array | None = None):
  """Like :func:`quantize`, also returning ``x * s`` (float32) and per-block ``s``."""
  _check_input(x)
  block, s, scale_inv = _scales(x, spec, history)
  scaled = x.astype(jnp.float32) * blocks.broadcast_blocks(s, block, x.shape)
  data = formats.saturating_cast(scaled, spec.fmt)
  if spec.store_e8m0:
    scale_inv = scale_inv.astype(ml_dtypes.float8_e8m0fnu)  # exact: a power of two
  return QTensor(data, scale_inv, block, jnp.dtype(x.dtype)), scaled, s


def quantize(x: jax.Array, spec: spec_lib.QuantSpec,
             history: jax.Array | None = None) -> QTensor:
  """Quantizes ``x`` to FP8 with per-block scales.

  Args:
    x: float array of shape ``S`` (any leading batch dimensions).
    spec: the quantization spec.
    history: float32 amax history ``[spec.history_len]``; required for delayed
      scaling, refused for current scaling.

  Returns:
    A :class:`QTensor` with ``data`` of shape ``S``.
  """
  return quantize_with_scaled(x, spec, history)[0]


def payload_f32(data: jax.Array) -> jax.Array:
  """An FP8 payload as float32, behind ``lax.optimization_barrier``: with excess
  precision allowed (its default), XLA:GPU otherwise removes an f32 -> fp8 -> f32
  round trip under jit, and with it the quantization."""
  return lax.optimization_barrier(data).astype(jnp.float32)


def dequantize(qt: QTensor, dtype=None) -> jax.Array:
  """Reverses :func:`quantize`: ``data * scale_inv`` in float32, cast to ``dtype``.

  A payload rounded up next to the output dtype's largest value (possible with
  power-of-two scales) saturates at that value: a finite input never comes back inf.

  Args:
    qt: the quantized tensor.
    dtype: output dtype; defaults to the dtype of the quantized input.
  """
  dtype = jnp.dtype(qt.dtype if dtype is None else dtype)
  scale_inv = blocks.broadcast_blocks(
      qt.scale_inv.astype(jnp.float32), qt.full_block, qt.shape)
  out = payload_f32(qt.data) * scale_inv
  top = float(jnp.finfo(dtype).max)
  return jnp.clip(out, -top, top).astype(dtype)


def quantize_dequantize(x: jax.Array, spec: spec_lib.QuantSpec,
                        history: jax.Array | None = None, *, telemetry: bool = False):
  """The fake-quant round trip WITHOUT a custom gradient.

  The FP8 payload passes through ``lax.optimization_barrier`` (in :func:`dequantize`)
  so that XLA cannot fold the f32 -> fp8 -> f32 conversions away.

  Returns:
    ``x_hat`` (dtype of ``x``), or ``(x_hat, QuantTelemetry)`` with ``telemetry``.
  """
  qt, scaled, s = quantize_with_scaled(x, spec, history)
  x_hat = dequantize(qt)
  if not telemetry:
    return x_hat
  return x_hat, telemetry_lib.measure(x, scaled, qt.data, x_hat, s, spec.fmt.dtype)


def quantize_and_update(x: jax.Array, spec: spec_lib.QuantSpec, history: jax.Array):
  """Delayed scaling, state in / state out.

  Quantizes ``x`` with the scale from ``history`` (previous steps), then pushes the
  amax of ``x`` into the history.

  Returns:
    ``(QTensor, new_history)``.
  """
  qt = quantize(x, spec, history)
  return qt, delayed.update_history(delayed.as_float32(history), delayed.tensor_amax(x))
