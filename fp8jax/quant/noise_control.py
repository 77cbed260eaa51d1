"""The noise-matched control of a quantization: the same error energy, no structure.

A quantization ``x -> x_hat`` has the error ``e = x_hat - x``. Its control keeps the size
of that error in every scale block and drops its structure (its correlation with ``x``,
its grid, saturation, ties)::

    x_ctl = x + r_b * z_b           for the nonzero finite elements of block b
    r_b^2 = sum_b(e^2) / n_b        n_b: the nonzero finite elements of block b
    z_b   = g * sqrt(n_b / sum_b(g^2)),  g ~ N(0, 1) i.i.d.

so ``sum_b (x_ctl - x)^2 == sum_b e^2`` in every block (to float32 rounding) and the noise
is unbiased (``E[z] = 0`` by the symmetry of ``g``). Zeros stay exact zeros, as they are
under every format (no zero point), so the zero-padded rows of a grouped GEMM gain no
noise; NaN and inf elements take the quantization's own value. The draws come from a key
derived from ``x``'s bits (:func:`fp8jax.quant.rounding_bits.content_key`): the same tensor
gets the same noise, so an operand re-quantized in the backward pass sees the same
control as in the forward pass, and each new tensor gets fresh noise.

A quantized tensor of a control (``fp8jax.quantize`` with such a spec) holds the noisy values
themselves: float32 "payloads" with unit float32 block scales and no tensor level. The
GEMM simulation multiplies them in float32 (the Pallas kernels take 8-bit payloads only,
so the XLA path runs); dequantizing gives ``x_ctl``. The spec flag is
``QuantSpec(noise_control=True)``; :func:`fp8jax.models.policy.noise_policy` turns every
quantization of a precision policy into its control.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp8jax.numerics import blocks
from fp8jax.quant import rounding_bits

NOISE_STREAM = 0x0C7A
"""The content-key stream of the control's draws (apart from stochastic rounding's)."""


def matched_noise(x: jax.Array, x_hat: jax.Array, block: tuple[int, ...],
                  key: jax.Array | None = None) -> jax.Array:
  """``x`` plus noise with the energy of ``x_hat - x`` in every block (float32).

  Args:
    x: the tensor before quantization, shape ``S``.
    x_hat: its quantize-dequantize round trip, shape ``S``.
    block: the scale block shape, one entry per axis of ``x``.
    key: PRNG key of the draws; None derives one from ``x``'s bits.

  Returns:
    float32 ``S``: ``x_ctl`` as defined above.
  """
  x32, xh32 = x.astype(jnp.float32), x_hat.astype(jnp.float32)
  live = jnp.isfinite(x32) & (x32 != 0) & jnp.isfinite(xh32)
  err = jnp.where(live, xh32 - x32, 0.0)
  if key is None:
    key = rounding_bits.content_key(x, NOISE_STREAM)
  g = jnp.where(live, jax.random.normal(key, x.shape, jnp.float32), 0.0)
  # r_b * z_b = g * sqrt(sum_b e^2 / sum_b g^2): the n_b of r_b and z_b cancel.
  err_sq, g_sq = blocks.block_sum(err * err, block), blocks.block_sum(g * g, block)
  gain = jnp.where(g_sq > 0, jnp.sqrt(err_sq / jnp.where(g_sq > 0, g_sq, 1.0)), 0.0)
  noisy = x32 + g * blocks.broadcast_blocks(gain, block, x.shape)
  return jnp.where(live, noisy, xh32)
