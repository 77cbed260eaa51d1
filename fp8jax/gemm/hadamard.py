"""The random Hadamard transform (RHT) of the NVFP4 recipe's Wgrad operands.

``dW = X^T dY`` contracts over the tokens. Multiplying both operands along that axis by
the same orthogonal matrix leaves the product unchanged, ``(X^T Q)(Q^T dY) = X^T dY``, while
it spreads outliers over the blocks that share a scale (arXiv 2509.25149, section 4; the
transform of Transformer Engine's NVFP4 recipe). Here ``Q`` is block diagonal with blocks
``diag(s) H_n / sqrt(n)``: ``H_n`` the Sylvester Hadamard matrix of order ``n`` (16 in the
recipe) and ``s`` a ±1 vector that flips the matrix's rows; a run ``x`` of ``n`` elements
becomes the row vector ``x @ (diag(s) H_n / sqrt(n))``, i.e. ``s`` multiplies the data
before the Hadamard matrix mixes it.

Signs (``signs=``):

* ``"te"`` (the default): Transformer Engine's fixed vector :data:`TE_SIGNS`, the same in
  its JAX recipe (``transformer_engine/jax/quantize/hadamard.py``,
  ``get_wgrad_sign_vector`` and ``get_rht_matrix``: ``diag(s) @ H / sqrt(16)``, applied as
  ``x.reshape(-1, 16) @ h``) and its PyTorch reference quantizer
  (``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py``), read at
  NVIDIA/TransformerEngine commit d0067d0da6cb01811b8072a7d304f0e00344ce2b. Order 16 only.
* ``"random"``: a ±1 vector drawn from ``seed`` (``numpy.random.default_rng``); ``seed=None``
  keeps every sign +1.
* ``"none"``: every sign +1.

Precision (``dtype=``): ``"bfloat16"`` (the default) is TE's: its JAX recipe builds the
matrix in bfloat16 (``get_rht_matrix`` returns bfloat16; ±1/4 is exact there), its RHT
kernels take BF16 operands, accumulate in FP32 and round the result to BF16 before the
amax and the quantization (``hadamard_transform_cast_fusion.cu``: "Downcast to BF16 for
bit-wise compatibility with unfused kernels"). Here the operand is rounded to bfloat16, the
products (exact in float32) are summed in float32 and the sums rounded to bfloat16 (to
float32 summation order). ``"float32"`` keeps the operand and the sums in float32 (HIGHEST
precision). TE applies the transform to the column-wise (transposed, token-contracting)
1x16 NVFP4 operands only, i.e. to Wgrad's X^T and dY^T, never to the 16x16 weights.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

TE_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
"""Transformer Engine's sign vector of the 16-point RHT (``get_wgrad_sign_vector``)."""
SIGNS = ("te", "random", "none")
DTYPES = ("bfloat16", "float32")


def check_options(size: int, signs: str, dtype: str) -> None:
  """ValueError unless ``signs`` and ``dtype`` are known and ``signs`` fits ``size``."""
  if signs not in SIGNS:
    raise ValueError(f"unknown Hadamard signs {signs!r}; choose one of {SIGNS}")
  if dtype not in DTYPES:
    raise ValueError(f"unknown Hadamard dtype {dtype!r}; choose one of {DTYPES}")
  if signs == "te" and size != len(TE_SIGNS):
    raise ValueError(f"Transformer Engine's Hadamard signs are for size {len(TE_SIGNS)}, got "
                     f"{size}; use signs 'random' or 'none' for other sizes")


@functools.cache
def hadamard_matrix(n: int, signs: str = "te", seed: int | None = 0) -> np.ndarray:
  """``diag(s) H_n / sqrt(n)`` as float32 [n, n] (orthogonal), ``s`` chosen by ``signs``
  (``seed`` is used by ``signs="random"`` only; see the module docstring)."""
  if n < 1 or n & (n - 1):
    raise ValueError(f"the Hadamard size must be a power of two, got {n}")
  check_options(n, signs, "float32")
  h = np.ones((1, 1))
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  if signs == "te":
    h = np.asarray(TE_SIGNS, np.float64)[:, None] * h
  elif signs == "random" and seed is not None:
    h = np.random.default_rng(seed).choice([-1.0, 1.0], size=n)[:, None] * h
  out = (h / np.sqrt(n)).astype(np.float32)
  out.setflags(write=False)
  return out


def _to_bfloat16(v: jax.Array) -> jax.Array:
  """float32 ``v`` rounded to bfloat16 values (nearest even), kept in float32:
  ``reduce_precision``, which XLA never deletes as it may an f32 -> bf16 -> f32 pair."""
  return jax.lax.reduce_precision(v, exponent_bits=8, mantissa_bits=7)


def random_hadamard(x: jax.Array, size: int = 16, signs: str = "te", seed: int | None = 0,
                    dtype: str = "bfloat16") -> jax.Array:
  """Applies the block-diagonal RHT along the last axis of ``x``.

  Args:
    x: float array [..., T]; T is zero-padded to a multiple of ``size`` (padding
      contributes nothing to a product over T).
    size: block size of the transform (a power of two).
    signs: "te" (Transformer Engine's fixed signs; size 16), "random" (drawn from
      ``seed``) or "none".
    seed: seed of the random signs (``signs="random"``; None: no signs).
    dtype: "bfloat16" (TE: operand and result rounded to bfloat16, the matrix in
      bfloat16, FP32 sums) or "float32" (operand, matrix and sums in float32).

  Returns:
    float32 [..., ceil(T / size) * size]: each run of ``size`` elements multiplied by the
    orthogonal block, ``x_blk @ Q`` (products exact, sums in float32), holding bfloat16
    values with ``dtype="bfloat16"``.
  """
  check_options(size, signs, dtype)
  q = hadamard_matrix(size, signs, seed)
  t = x.shape[-1]
  t_pad = -(-t // size) * size
  x = x.astype(jnp.float32)
  if dtype == "bfloat16":  # bfloat16 operand and matrix; their products are exact in f32
    q = q.astype(jnp.bfloat16)
    x = _to_bfloat16(x)
  q = jnp.asarray(q, jnp.float32)
  if t_pad != t:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, t_pad - t)])
  blocks = x.reshape(*x.shape[:-1], t_pad // size, size)
  out = jnp.einsum("...bi,ij->...bj", blocks, q, precision=jax.lax.Precision.HIGHEST)
  if dtype == "bfloat16":
    out = _to_bfloat16(out)
  return out.reshape(*x.shape[:-1], t_pad)


__all__ = ["DTYPES", "SIGNS", "TE_SIGNS", "check_options", "hadamard_matrix",
           "random_hadamard"]
