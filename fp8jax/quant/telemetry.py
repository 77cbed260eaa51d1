"""Quantization telemetry: a small pytree of scalars per quantize call.

It is computed only when asked for (a Python-level switch), so it costs nothing when
off. Non-finite inputs are counted, never folded into the power averages.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fp8jax.numerics import formats


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantTelemetry:
  """Scalars (float32) describing one quantization.

  Attributes:
    amax: largest finite |x| of the tensor.
    scale_min: smallest quantization multiplier ``s`` over the blocks (a block holding
      NaN or inf has ``s = 1``).
    scale_max: largest ``s`` over the blocks.
    saturated_frac: fraction of elements that the saturating cast clipped: those
      where a plain cast of x * s would overflow (±inf inputs included). Values
      that round down to ±max anyway (e.g. 460 in E4M3) are not counted.
    underflow_frac: fraction of the non-zero finite elements flushed to zero.
    nonfinite_frac: fraction of elements that are NaN or ±inf.
    signal_power: mean x**2 over finite elements.
    noise_power: mean (x - x_hat)**2 over finite elements; NaN when a block holding NaN
      or inf made its finite elements NaN too (``fp8jax.numerics.scales``).
    snr_db: 10 log10(signal_power / noise_power); +inf when the round trip is exact, NaN
      with a NaN noise power.
  """

  amax: jax.Array
  scale_min: jax.Array
  scale_max: jax.Array
  saturated_frac: jax.Array
  underflow_frac: jax.Array
  nonfinite_frac: jax.Array
  signal_power: jax.Array
  noise_power: jax.Array
  snr_db: jax.Array


def measure(x: jax.Array, scaled: jax.Array, payload: jax.Array, x_hat: jax.Array,
            s: jax.Array, fmt) -> QuantTelemetry:
  """Telemetry of one quantization.

  Args:
    x: the input, any shape.
    scaled: ``x * s`` in float32 before the cast, shape of ``x``.
    payload: the stored payload, shape of ``x``.
    x_hat: the dequantized tensor, shape of ``x``.
    s: per-block quantization multipliers (any shape).
    fmt: the element format (``fp8jax.numerics.formats.FloatFormat``). An element is
      saturated where round-to-nearest-even with an unbounded exponent would give a
      magnitude above ``fmt.max``.
  """
  xf = x.astype(jnp.float32)
  finite = jnp.isfinite(xf)
  n = jnp.float32(max(x.size, 1))
  n_finite = jnp.maximum(jnp.sum(finite, dtype=jnp.float32), 1.0)
  x0 = jnp.where(finite, xf, 0.0)
  err = jnp.where(finite, x0 - x_hat.astype(jnp.float32), 0.0)
  nonzero = finite & (xf != 0)
  flushed = nonzero & (payload.astype(jnp.float32) == 0)
  signal = jnp.sum(x0 * x0) / n_finite
  noise = jnp.sum(err * err) / n_finite
  overflow = saturates(jnp.abs(scaled.astype(jnp.float32)), fmt)
  snr = jnp.where(noise > 0, 10.0 * jnp.log10(signal / jnp.where(noise > 0, noise, 1.0)),
                  jnp.where(noise == 0, jnp.inf, jnp.nan))  # NaN noise: NaN, never +inf
  return QuantTelemetry(
      amax=jnp.max(jnp.abs(x0), initial=0.0),
      scale_min=jnp.min(s).astype(jnp.float32) if s.size else jnp.float32(0),
      scale_max=jnp.max(s).astype(jnp.float32) if s.size else jnp.float32(0),
      saturated_frac=jnp.sum(overflow, dtype=jnp.float32) / n,
      underflow_frac=jnp.sum(flushed, dtype=jnp.float32)
      / jnp.maximum(jnp.sum(nonzero, dtype=jnp.float32), 1.0),
      nonfinite_frac=jnp.sum(~finite, dtype=jnp.float32) / n,
      signal_power=signal,
      noise_power=noise,
      snr_db=snr.astype(jnp.float32),
  )


saturates = formats.saturates  # also this module's API
