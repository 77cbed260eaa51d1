"""The random Hadamard transform (RHT) of the NVFP4 recipe's Wgrad operands.

``dW = X^T dY`` contracts over the tokens. Multiplying both operands along that axis by
the same orthogonal matrix leaves the product unchanged, ``(X^T Q)(Q^T dY) = X^T dY``, while
it spreads outliers over the blocks that share a scale (arXiv 2509.25149, section 4; the
transform of Transformer Engine's NVFP4 recipe). Here ``Q`` is block diagonal with blocks
``diag(signs) H_n / sqrt(n)``: ``H_n`` the Sylvester Hadamard matrix of order ``n`` (16 in
the recipe) and ``signs`` a fixed random ±1 vector drawn from a seed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.cache
def hadamard_matrix(n: int, seed: int | None = 0) -> np.ndarray:
  """``diag(signs) H_n / sqrt(n)`` as float32 [n, n] (orthogonal); ``seed=None`` keeps
  all signs +1."""
  if n < 1 or n & (n - 1):
    raise ValueError(f"the Hadamard size must be a power of two, got {n}")
  h = np.ones((1, 1))
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  if seed is not None:
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=n)
    h = signs[:, None] * h
  out = (h / np.sqrt(n)).astype(np.float32)
  out.setflags(write=False)
  return out


def random_hadamard(x: jax.Array, size: int = 16, seed: int | None = 0) -> jax.Array:
  """Applies the block-diagonal RHT along the last axis of ``x``.

  Args:
    x: float array [..., T]; T is zero-padded to a multiple of ``size`` (padding
      contributes nothing to a product over T).
    size: block size of the transform (a power of two).
    seed: seed of the sign vector (None: no signs).

  Returns:
    float32 [..., ceil(T / size) * size]: each run of ``size`` elements multiplied by the
    orthogonal block ``x_blk @ Q`` (computed at HIGHEST precision).
  """
  q = jnp.asarray(hadamard_matrix(size, seed))
  t = x.shape[-1]
  t_pad = -(-t // size) * size
  x = x.astype(jnp.float32)
  if t_pad != t:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, t_pad - t)])
  blocks = x.reshape(*x.shape[:-1], t_pad // size, size)
  out = jnp.einsum("...bi,ij->...bj", blocks, q, precision=jax.lax.Precision.HIGHEST)
  return out.reshape(*x.shape[:-1], t_pad)


__all__ = ["hadamard_matrix", "random_hadamard"]
