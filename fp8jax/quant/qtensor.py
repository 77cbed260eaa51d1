"""`quantize` / `dequantize` and the `QTensor` container.

Inputs may be float32, bfloat16 or float16 of any shape; the scaled values are formed
in float32 (``x.astype(f32) * s``) and rounded once to the element format with saturation
(to nearest even, or stochastically: see ``fp8jax.quant.rounding_bits``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from fp8jax.numerics import arguments, blocks, formats, four_over_six, ms_eden, scales
from fp8jax.numerics import spec as spec_lib
from fp8jax.quant import delayed, noise_control, rounding_bits
from fp8jax.quant import telemetry as telemetry_lib


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["data", "scale_inv", "tensor_scale_inv"],
    meta_fields=["block", "dtype"])
@dataclasses.dataclass(frozen=True)
class QTensor:
  """A low-precision payload with its per-block dequantization multipliers.

  ``x ≈ data * broadcast(scale_inv) [* tensor_scale_inv]``.

  Attributes:
    data: payload of the original shape ``S``, in the format's ``storage_dtype``
      (FP8, float4_e2m1fn, or E4M3 holding FP6 values).
    scale_inv: per-block multipliers of shape ``ceil(S / block)``: float32 (UE5M3
      block scales too), float8_e8m0fnu (MX) or float8_e4m3fn (NVFP4 block scales). NaN
      marks a block holding NaN in a format without a NaN code.
    block: block shape aligned to the trailing axes of ``data``; leading axes not
      covered (for example those added by ``jax.vmap`` with the default
      ``out_axes=0``; other ``out_axes`` are not supported) have block size 1.
    dtype: dtype that ``dequantize`` returns by default (the input's dtype).
    tensor_scale_inv: float32, the second level of two-level (NVFP4) scales: a scalar
      per tensor, or per row (``QuantSpec.row_scaled``: ``scale_inv``'s shape with the
      tile's axis 1, broadcastable to ``data``); None for one-level scales.
  """

  data: jax.Array
  scale_inv: jax.Array
  block: tuple[int, ...]
  dtype: np.dtype
  tensor_scale_inv: jax.Array | None = None

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.data.shape)

  @property
  def full_block(self) -> tuple[int, ...]:
    """The block shape with one entry per axis of ``data``."""
    return blocks.align_block(self.block, self.data.ndim)


def _check_input(x: jax.Array, fn: str = "quantize") -> None:
  arguments.array(x, "x", fn)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"{fn}: x must be a floating-point array, got dtype {x.dtype}")
  if jnp.dtype(x.dtype).itemsize == 1:
    raise TypeError(f"{fn}: x is already 8-bit ({x.dtype}); dequantize it first")


def _scales(x, spec, history, amax=None):
  """Per-block ``(s, scale_inv)`` of shape ``num_blocks``, ``tensor_scale_inv`` (or
  None) and the block shape."""
  block = spec.granularity.block_shape(x.shape)
  if amax is None and not spec.four_over_six:  # Four Over Six reads the blocks themselves
    amax = blocks.block_amax(x, block)
  tensor_scale_inv = None
  if spec.scaling == "delayed":
    delayed.check_history(history, spec, "forward")
    s, scale_inv = delayed.history_scale(
        delayed.as_float32(history), spec, jnp.max(amax, initial=0.0))
    s, scale_inv = (jnp.broadcast_to(v, amax.shape) for v in (s, scale_inv))
    s, scale_inv = scales.mark_nonfinite(s, scale_inv, amax)  # also with a history
  else:
    if history is not None:
      raise ValueError(f"spec {spec.describe()} uses current scaling; it takes no history")
    if spec.four_over_six:  # the scale of each block chosen by its error
      s, scale_inv, tensor_scale_inv, _ = four_over_six.scales_of(x, block, spec)
    else:
      s, scale_inv, tensor_scale_inv = scales.compute_scales(amax, spec)
  return block, s, scale_inv, tensor_scale_inv


def traced(*args) -> bool:
  """Whether any array of ``args`` is a tracer (inside ``jit``, ``grad``, ``vmap``...)."""
  return any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(args))


def quantize_with_scaled(x: jax.Array, spec: spec_lib.QuantSpec,
                         history: jax.Array | None = None, key: jax.Array | None = None,
                         amax: jax.Array | None = None):
  """Like :func:`quantize`, also returning ``x * s`` (float32) and per-block ``s``.

  Called on concrete arrays (outside any transformation), it runs as one compiled program
  per shape and spec, the program a jitted caller runs, instead of op by op."""
  _check_input(x)
  spec = arguments.quant_spec(spec, "spec", "quantize")
  if traced(x, history, key, amax):
    return _quantize_with_scaled(x, spec, history, key, amax)
  return _quantize_compiled(x, spec, history, key, amax)


def _quantize_with_scaled(x, spec, history, key, amax):
  if spec.noise_control:  # the format's own quantization, then its error replaced
    qt, scaled, s = _quantize_with_scaled(x, spec.replace(noise_control=False), history,
                                          key, amax)
    noisy = noise_control.matched_noise(x, dequantize(qt, jnp.float32), qt.full_block)
    ones = jnp.ones(qt.scale_inv.shape, jnp.float32)
    return QTensor(noisy, ones, qt.block, qt.dtype), scaled, s
  if spec.rounding == "ms_eden":  # elements to nearest, the block scales stochastically
    q, s, scale_inv, d, scaled = ms_eden.quantize_blocks(
        x, rounding_bits.rounding_bits(x, spec, key))
    block = spec.granularity.block_shape(x.shape)
    return QTensor(q.astype(spec.fmt.storage_dtype), scale_inv.astype(ml_dtypes.float8_e4m3fn),
                   block, jnp.dtype(x.dtype), d), scaled, s
  block, s, scale_inv, tensor_scale_inv = _scales(x, spec, history, amax)
  scaled = x.astype(jnp.float32) * blocks.broadcast_blocks(s, block, x.shape)
  bits = rounding_bits.rounding_bits(x, spec, key)
  if bits is None and spec.fmt.storage_dtype is spec.fmt.dtype and spec.fmt.has_nan:
    data = formats.saturating_cast(scaled, spec.fmt)
  else:
    q = scales.round_elements(scaled, spec.fmt, bits, spec.sr_bits)
    if not spec.fmt.has_nan:
      q = jnp.where(jnp.isnan(q), 0.0, q)  # the block's scale carries the NaN
    data = q.astype(spec.fmt.storage_dtype)  # exact: q holds format values
  if spec.store_e8m0:
    scale_inv = scale_inv.astype(ml_dtypes.float8_e8m0fnu)  # exact: a power of two
  elif spec.scale_format == "e4m3":
    scale_inv = scale_inv.astype(ml_dtypes.float8_e4m3fn)  # exact: E4M3 values
  qt = QTensor(data, scale_inv, block, jnp.dtype(x.dtype), tensor_scale_inv)
  return qt, scaled, s


_quantize_compiled = jax.jit(_quantize_with_scaled, static_argnums=1)


def quantize(x: jax.Array, spec: spec_lib.QuantSpec,
             history: jax.Array | None = None, key: jax.Array | None = None,
             amax: jax.Array | None = None) -> QTensor:
  """Quantizes ``x`` with per-block scales.

  Args:
    x: float array of shape ``S`` (any leading batch dimensions).
    spec: the quantization spec.
    history: float32 amax history ``[spec.history_len]``; required for delayed
      scaling, refused for current scaling.
    key: PRNG key for stochastic rounding (``spec.rounding == "stochastic"``); None
      derives one from ``x``'s bits (``fp8jax.quant.rounding_bits``). Ignored otherwise.
    amax: the per-block largest finite magnitudes (float32, ``num_blocks``) when the
      caller has them (e.g. taken on another layout of ``x``); None computes them.

  Returns:
    A :class:`QTensor` with ``data`` of shape ``S``. With ``spec.noise_control`` its
    ``data`` holds the noise-matched control's values in float32, with unit float32 block
    scales (see :mod:`fp8jax.quant.noise_control`).
  """
  return quantize_with_scaled(x, spec, history, key, amax)[0]


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

  On concrete arrays it runs as one compiled program, as :func:`quantize` does.
  """
  if not isinstance(qt, QTensor):
    raise TypeError(f"dequantize: qt must be a QTensor (from fp8jax.quantize), got "
                    f"{type(qt).__name__}")
  dtype = arguments.dtype(qt.dtype if dtype is None else dtype, "dtype", "dequantize")
  if traced(qt):
    return _dequantize(qt, dtype)
  return _dequantize_compiled(qt, dtype)


def _dequantize(qt: QTensor, dtype) -> jax.Array:
  scale_inv = blocks.broadcast_blocks(
      qt.scale_inv.astype(jnp.float32), qt.full_block, qt.shape)
  out = payload_f32(qt.data) * scale_inv
  if qt.tensor_scale_inv is not None:
    out = out * qt.tensor_scale_inv
  top = float(jnp.finfo(dtype).max)
  out = jnp.where(jnp.isnan(out), out, jnp.clip(out, -top, top))
  return out.astype(dtype)


_dequantize_compiled = jax.jit(_dequantize, static_argnums=1)


def quantize_dequantize(x: jax.Array, spec: spec_lib.QuantSpec,
                        history: jax.Array | None = None, *, key: jax.Array | None = None,
                        telemetry: bool = False):
  """The fake-quant round trip WITHOUT a custom gradient.

  The FP8 payload passes through ``lax.optimization_barrier`` (in :func:`dequantize`)
  so that XLA cannot fold the f32 -> fp8 -> f32 conversions away.

  Returns:
    ``x_hat`` (dtype of ``x``), or ``(x_hat, QuantTelemetry)`` with ``telemetry``.
  """
  _check_input(x, "quantize_dequantize")
  spec = arguments.quant_spec(spec, "spec", "quantize_dequantize")
  if traced(x, history, key):
    return _quantize_dequantize(x, spec, history, key, telemetry)
  return _quantize_dequantize_compiled(x, spec, history, key, telemetry)


def _quantize_dequantize(x, spec, history, key, telemetry):
  qt, scaled, s = _quantize_with_scaled(x, spec, history, key, None)
  x_hat = dequantize(qt)
  if not telemetry:
    return x_hat
  if spec.noise_control:  # the telemetry describes the format's own quantization
    qt = quantize(x, spec.replace(noise_control=False), history, key)
    rules = telemetry_lib.scale_rule_blocks(x, qt, spec)
    return x_hat, telemetry_lib.measure(x, scaled, qt.data, dequantize(qt), s, spec.fmt,
                                        rules)
  rules = telemetry_lib.scale_rule_blocks(x, qt, spec)
  return x_hat, telemetry_lib.measure(x, scaled, qt.data, x_hat, s, spec.fmt, rules)


_quantize_dequantize_compiled = jax.jit(_quantize_dequantize, static_argnums=(1, 4))


def quantize_and_update(x: jax.Array, spec: spec_lib.QuantSpec, history: jax.Array):
  """Delayed scaling, state in / state out.

  Quantizes ``x`` with the scale from ``history`` (previous steps), then pushes the
  amax of ``x`` into the history.

  Returns:
    ``(QTensor, new_history)``.
  """
  _check_input(x, "quantize_and_update")
  spec = arguments.quant_spec(spec, "spec", "quantize_and_update")
  qt = quantize(x, spec, history)
  return qt, delayed.update_history(delayed.as_float32(history), delayed.tensor_amax(x))
