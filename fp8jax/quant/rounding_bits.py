"""Random bits for stochastic rounding: from a PRNG key, or derived from the input.

Stochastic rounding is deterministic given its key. Where no key is passed (a model site,
a GEMM operand deep inside a layer), the key is derived from the tensor itself: a
position-weighted hash of its float32 bit pattern folded into a fixed key (plus a
``stream`` number that keeps, e.g., a GEMM's two operands apart). Equal inputs then round
equally, and each new input, as every training step's gradient is, gets fresh draws; pass
explicit keys where independent draws of the same tensor are wanted (e.g. to measure the
rounding's bias).
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from fp8jax.numerics import spec as spec_lib

_GOLDEN = np.uint32(0x9E3779B9)


def content_key(x: jax.Array, stream: int = 0) -> jax.Array:
  """A PRNG key that is a function of ``x``'s float32 bits (and ``stream``).

  One pass over ``x``: ``sum(bits[i] * (2 * i + 1) * 0x9E3779B9)`` modulo 2**32, then a
  final avalanche by ``fold_in``.
  """
  bits = lax.bitcast_convert_type(jnp.asarray(x).astype(jnp.float32), jnp.uint32).ravel()
  weights = (lax.iota(jnp.uint32, bits.size) * np.uint32(2) + np.uint32(1)) * _GOLDEN
  digest = jnp.sum(bits * weights, dtype=jnp.uint32)
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(0x5EED), stream), digest)


def rounding_bits(x: jax.Array, spec: spec_lib.QuantSpec, key: jax.Array | None = None,
                  stream: int = 0) -> jax.Array | None:
  """uint32 random bits shaped like ``x`` when ``spec`` rounds stochastically, one per
  1 x 16 block (``[..., ceil(C / 16)]``) for MS-EDEN's block scales, else None.

  Args:
    x: the tensor to be quantized.
    spec: its spec.
    key: a ``jax.random`` key (typed or raw uint32), or None to derive one from ``x``.
    stream: separates the draws of several tensors derived from one input.
  """
  if spec.rounding == "nearest":
    return None
  if key is None:
    key = content_key(x, stream)
  elif stream:
    key = jax.random.fold_in(key, stream)
  shape = tuple(jnp.shape(x))
  if spec.rounding == "ms_eden":
    shape = (*shape[:-1], -(-shape[-1] // 16))
  return jax.random.bits(key, shape, jnp.uint32)


__all__ = ["content_key", "rounding_bits"]
