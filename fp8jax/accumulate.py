"""Blockwise-scaled FP8 matrix products with a choice of accumulator.

The operands are quantized tensors in *contraction-last* layout, A [B, M, K] and
Bt [B, N, K]; the result is ``Y[b, m, n] = sum_k A[b, m, k] Bt[b, n, k]`` in float32.
As in a blockwise kernel (DeepGEMM), K is walked in intervals; the raw FP8 products
of one interval are summed, then the interval's partial sum is *promoted*:
``acc32 = acc32 + partial * (scale_inv_A * scale_inv_B)`` in float32. The scales must
therefore be constant over every interval of K.

Two accumulators (:class:`Accumulation`):

``fp32``
  Each interval's products are summed in float32 (the products of two FP8 values are
  exact in float32). Intervals are as long as the scale blocks along K allow.

``tensor_core``
  A model of Hopper FP8 tensor-core (wgmma) accumulation. Inside a promotion interval of
  ``promotion_interval`` elements of K (128 in DeepSeek-V3; None = never promote, the
  whole of K), products are taken in blocks of ``block_size`` (32). For each block, the
  running tensor-core accumulator and the block's products (exact) are aligned to the
  largest exponent among them, every addend is truncated toward zero to
  ``fraction_bits`` (13) fraction bits below that exponent, and the truncated addends
  are summed exactly: that sum is the new accumulator. At the end of an interval the
  accumulator is scaled and added to the float32 result, and restarts at zero.
  All of it is exact float32 arithmetic (integer-valued sums below 2**24), so the model
  gives the same bits on CPU and GPU, whatever the summation order. The promotion
  rounds ``partial * scale`` to float32 before adding it (a CUDA kernel usually fuses
  the two into one FMA: at most one float32 ulp of difference per promotion).
"""

from __future__ import annotations

import dataclasses
import math

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from fp8jax import qtensor

MODES = ("fp32", "tensor_core")


@dataclasses.dataclass(frozen=True)
class Accumulation:
  """How FP8 products are accumulated (see the module docstring).

  Attributes:
    mode: "fp32" or "tensor_core".
    fraction_bits: fraction bits kept below the block's largest exponent.
    block_size: products aligned and summed together (along K).
    promotion_interval: elements of K between promotions to float32; None = never.
  """

  mode: str = "fp32"
  fraction_bits: int = 13
  block_size: int = 32
  promotion_interval: int | None = 128

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"unknown accumulation mode {self.mode!r}; choose one of {MODES}")
    if self.block_size < 1:
      raise ValueError(f"block_size must be >= 1, got {self.block_size}")
    # The exact-sum argument needs (block_size + 1) addends of < 2**(fraction_bits + 1).
    if not 1 <= self.fraction_bits or (self.block_size + 1) * 2 ** (self.fraction_bits + 1) > 2**24:
      raise ValueError(
          f"fraction_bits={self.fraction_bits} with block_size={self.block_size} cannot be "
          "summed exactly in float32; need (block_size + 1) * 2**(fraction_bits + 1) <= 2**24")
    p = self.promotion_interval
    if p is not None and (p < 1 or p % self.block_size):
      raise ValueError(f"promotion_interval must be a positive multiple of block_size "
                       f"({self.block_size}) or None, got {p}")

  def describe(self) -> str:
    if self.mode == "fp32":
      return "fp32"
    promo = "never" if self.promotion_interval is None else self.promotion_interval
    return f"tc{self.fraction_bits}b/{self.block_size}/promote {promo}"


FP32 = Accumulation("fp32")
HOPPER = Accumulation("tensor_core")
HOPPER_NO_PROMOTION = Accumulation("tensor_core", promotion_interval=None)


def _k_block(qt: qtensor.QTensor) -> int:
  return qt.full_block[-1]


def _interval_scales(qt: qtensor.QTensor, interval: int, n_intervals: int) -> jax.Array:
  """float32 scale_inv [B, R, n_intervals]: one per row and interval of K.

  Raises:
    ValueError: when an interval of K straddles two scale blocks.
  """
  k = qt.shape[-1]
  g = _k_block(qt)
  starts = np.arange(n_intervals) * interval
  ends = np.minimum(starts + interval, k) - 1
  first, last = starts // g, np.maximum(ends, starts) // g
  if np.any((first != last) & (starts < k)):
    raise ValueError(
        f"the operand's scale blocks along K ({g} elements) change inside an accumulation "
        f"interval of {interval}: a blockwise kernel applies scales only at promotion. "
        "Use a promotion interval that divides the K block, or scales constant along K.")
  s = qt.scale_inv.astype(jnp.float32)
  rows = qt.full_block[-2]
  s = jnp.repeat(s, rows, axis=-2)[..., : qt.shape[-2], :]
  return jnp.take(s, np.minimum(first, s.shape[-1] - 1), axis=-1)


def _pad_k(x: jax.Array, k_pad: int) -> jax.Array:
  k = x.shape[-1]
  return x if k == k_pad else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, k_pad - k)])


def aligned_block_sum(terms: jax.Array, fraction_bits: int) -> jax.Array:
  """Sum over the last axis after aligning to the largest exponent and truncating.

  Every addend is truncated toward zero to a multiple of ``2**(e_max - fraction_bits)``,
  where ``e_max = max floor(log2 |t|)`` over the non-zero addends.

  Args:
    terms: float32 [..., T] addends (exact FP8 products and the accumulator).
    fraction_bits: fraction bits kept below e_max.

  Returns:
    float32 [...], exact.
  """
  _, exp = jnp.frexp(terms)  # |t| = m * 2**exp, 0.5 <= m < 1
  exp = jnp.where(terms != 0, exp - 1, jnp.iinfo(jnp.int32).min // 2)
  shift = jnp.max(exp, axis=-1, keepdims=True) - fraction_bits
  ulps = jnp.trunc(jnp.ldexp(terms, -shift))
  return jnp.ldexp(jnp.sum(ulps, axis=-1), shift[..., 0])


def _fp32_products(a, bt, sa, sb, interval):
  """sum_j (A_j . Bt_j) * (sa_j * sb_j) with float32 interval sums."""
  b, m, k_pad = a.shape
  n = bt.shape[1]
  j = k_pad // interval
  parts = jnp.einsum("bmjc,bnjc->bmnj", a.reshape(b, m, j, interval),
                     bt.reshape(b, n, j, interval), precision=lax.Precision.HIGHEST,
                     preferred_element_type=jnp.float32)
  return jnp.sum(parts * (sa[:, :, None, :] * sb[:, None, :, :]), axis=-1)


def _tensor_core_products(a, bt, sa, sb, interval, acc: Accumulation):
  """Scan over blocks of K with the limited-precision accumulator."""
  b, m, k_pad = a.shape
  n = bt.shape[1]
  bs = acc.block_size
  steps = k_pad // bs
  per_interval = interval // bs
  a_blocks = jnp.moveaxis(a.reshape(b, m, steps, bs), 2, 0)
  b_blocks = jnp.moveaxis(bt.reshape(b, n, steps, bs), 2, 0)
  interval_of = np.arange(steps) // per_interval
  scales = jnp.moveaxis(sa, -1, 0)[interval_of][:, :, :, None] * \
      jnp.moveaxis(sb, -1, 0)[interval_of][:, :, None, :]
  ends = jnp.asarray((np.arange(steps) + 1) % per_interval == 0)

  def step(carry, xs):
    acc_tc, acc32 = carry
    a_t, b_t, scale_t, end_t = xs
    prods = a_t[:, :, None, :] * b_t[:, None, :, :]
    terms = jnp.concatenate([acc_tc[..., None], prods], axis=-1)
    acc_tc = aligned_block_sum(terms, acc.fraction_bits)
    # Round the product before the add: XLA would otherwise contract it into an FMA on
    # some backends and not others.
    promoted = acc32 + lax.optimization_barrier(acc_tc * scale_t)
    acc32 = jnp.where(end_t, promoted, acc32)
    acc_tc = jnp.where(end_t, jnp.zeros_like(acc_tc), acc_tc)
    return (acc_tc, acc32), None

  zeros = jnp.zeros((b, m, n), jnp.float32)
  (_, acc32), _ = lax.scan(step, (zeros, zeros), (a_blocks, b_blocks, scales, ends))
  return acc32


def scaled_matmul(a: qtensor.QTensor, bt: qtensor.QTensor,
                  acc: Accumulation = FP32) -> jax.Array:
  """Blockwise-scaled FP8 product of contraction-last operands.

  Args:
    a: quantized [B, M, K].
    bt: quantized [B, N, K].
    acc: the accumulator model.

  Returns:
    float32 [B, M, N].
  """
  if a.data.ndim != 3 or bt.data.ndim != 3 or a.shape[0] != bt.shape[0] or \
      a.shape[2] != bt.shape[2]:
    raise ValueError(f"scaled_matmul needs A [B, M, K] and Bt [B, N, K], got {a.shape} "
                     f"and {bt.shape}")
  k = a.shape[-1]
  ga, gb = min(_k_block(a), k), min(_k_block(bt), k)
  if acc.mode == "fp32":
    interval = math.gcd(ga, gb)
  else:
    interval = acc.promotion_interval or -(-k // acc.block_size) * acc.block_size
  k_pad = -(-k // interval) * interval
  n_int = k_pad // interval
  sa = _interval_scales(a, interval, n_int)
  sb = _interval_scales(bt, interval, n_int)
  # The barrier keeps XLA:GPU's GEMM rewriter from turning convert(fp8) -> dot into a
  # real FP8 cuBLASLt GEMM, whose own accumulation would replace the simulated one.
  a_f, b_f = lax.optimization_barrier((_pad_k(qtensor.payload_f32(a.data), k_pad),
                                       _pad_k(qtensor.payload_f32(bt.data), k_pad)))
  if acc.mode == "fp32":
    return _fp32_products(a_f, b_f, sa, sb, interval)
  return _tensor_core_products(a_f, b_f, sa, sb, interval, acc)
