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
  exact in float32). Intervals are as long as the scale blocks along K allow. The
  intervals are promoted one after the other, in order of K, each as
  ``acc32 = acc32 + partial * (sa * sb)`` with the product rounded to float32 before the
  add (the Pallas kernel may fuse it into an FMA: at most one float32 ulp per promotion).
  The order of the float32 additions *inside* an interval is the dot's (cuBLAS, Triton or
  Eigen), so platforms and implementations agree to float32 rounding of the interval sums.
  Two implementations (``impl`` of :func:`scaled_matmul`): ``"xla"`` loops over the
  intervals with one ``bf16 x bf16 -> float32`` dot per interval (FP8 payloads are exact
  in bfloat16, so the products are exact and summed in float32) and never holds more than
  a few ``[B, M, N]`` float32 arrays; ``"pallas"`` is the same computation as one kernel
  (:mod:`fp8jax.kernels.scaled_matmul_pallas`, Triton on GPU, interpreted elsewhere).
  ``"auto"`` takes the kernel on GPU when the intervals suit it (see
  :func:`fp32_impl`), else the loop.

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

from fp8jax.kernels import placement, scaled_matmul_pallas  # no import-time side effects
from fp8jax.quant import qtensor

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


def _dot_payload(data: jax.Array) -> jax.Array:
  """A payload as the dot's operand: bfloat16 where that is exact (8-bit floats: every FP8
  format has at most 3 fraction bits and an exponent range inside bfloat16's), else
  float32."""
  exact_bf16 = scaled_matmul_pallas.supports_payload(data.dtype)
  # The barrier keeps XLA from folding the convert into a neighbour (see payload_f32).
  return lax.optimization_barrier(data).astype(jnp.bfloat16 if exact_bf16 else jnp.float32)


def _fp32_products(a, bt, sa, sb, interval):
  """``sum_j (A_j . Bt_j) * (sa_j * sb_j)`` with float32 interval sums, j in order.

  A loop over the ``J = K_pad / interval`` intervals: each takes one
  ``[B, M, interval] x [B, N, interval] -> float32 [B, M, N]`` dot (bfloat16 payloads,
  float32 accumulation; float32 payloads at HIGHEST precision), rounds
  ``partial * (sa_j * sb_j)`` to float32 and adds it to the float32 accumulator. Memory:
  the accumulator and one interval's partial products, never ``[B, M, N, J]``.

  Args:
    a: payload [B, M, K_pad] (bfloat16 or float32).
    bt: payload [B, N, K_pad].
    sa: float32 [B, M, J].
    sb: float32 [B, N, J].
    interval: elements of K per interval.
  """
  b, m, k_pad = a.shape
  n = bt.shape[1]
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else lax.Precision.DEFAULT

  def step(j, acc32):
    a_j = lax.dynamic_slice_in_dim(a, j * interval, interval, axis=2)
    b_j = lax.dynamic_slice_in_dim(bt, j * interval, interval, axis=2)
    part = jnp.einsum("bmc,bnc->bmn", a_j, b_j, precision=precision,
                      preferred_element_type=jnp.float32)
    scale = (lax.dynamic_index_in_dim(sa, j, axis=2, keepdims=False)[:, :, None] *
             lax.dynamic_index_in_dim(sb, j, axis=2, keepdims=False)[:, None, :])
    # Round the product before the add (no backend-dependent FMA contraction).
    return acc32 + lax.optimization_barrier(part * scale)

  return lax.fori_loop(0, k_pad // interval, step, jnp.zeros((b, m, n), jnp.float32))


def tensor_core_interval(k: int, acc: Accumulation) -> int:
  """The promotion interval (elements of K) of the tensor-core model for a contraction of
  ``k`` elements: ``acc.promotion_interval``, or all of K rounded up to whole blocks."""
  return acc.promotion_interval or -(-k // acc.block_size) * acc.block_size


def tensor_core_operand(qt: qtensor.QTensor, interval: int):
  """An operand of :func:`tensor_core_products`.

  Args:
    qt: quantized [..., R, K], scales constant over every interval of K.
    interval: the promotion interval (:func:`tensor_core_interval`).

  Returns:
    ``(payload float32 [..., R, K_pad], scale_inv float32 [..., R, J])``: K zero-padded to
    ``J = K_pad / interval`` whole intervals.

  Raises:
    ValueError: when an interval straddles two scale blocks.
  """
  k_pad = -(-qt.shape[-1] // interval) * interval
  return (_pad_k(qtensor.payload_f32(qt.data), k_pad),
          _interval_scales(qt, interval, k_pad // interval))


def tensor_core_products(a, bt, sa, sb, interval: int, acc: Accumulation) -> jax.Array:
  """The tensor-core model (module docstring): a scan over blocks of K.

  Args:
    a: float32 payload [B, M, K_pad] (exact FP8 values), K_pad a multiple of ``interval``.
    bt: float32 payload [B, N, K_pad].
    sa: float32 scale_inv [B, M, J], one per row and interval.
    sb: float32 scale_inv [B, N, J].
    interval: promotion interval, a multiple of ``acc.block_size``.
    acc: the tensor-core accumulator.

  Returns:
    float32 [B, M, N]; every element depends on its own row and column only.
  """
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


IMPLS = ("auto", "xla", "pallas")
"""Implementations of FP32 accumulation (:func:`fp32_impl`); ``GemmConfig.impl`` picks one."""


def check_impl(impl, what: str = "scaled_matmul implementation") -> str:
  """``impl`` when it is one of :data:`IMPLS`, else a ValueError naming ``what``."""
  if impl not in IMPLS:
    raise ValueError(f"unknown {what} {impl!r}; choose one of {IMPLS}")
  return impl


def fp32_impl(interval: int, payload_dtypes=(), impl: str = "auto",
              backend: str | None = None) -> str:
  """The implementation, ``"xla"`` or ``"pallas"``, of FP32 accumulation.

  Args:
    interval: promotion interval (elements of K).
    payload_dtypes: dtypes of the payloads (the kernel takes 8-bit floats and bfloat16).
    impl: ``"auto"`` (the Pallas kernel on GPU when it supports ``interval`` and the
      payload and no multi-device context mesh is set, see
      :mod:`fp8jax.kernels.placement`; else the XLA loop), ``"xla"`` or ``"pallas"``.
    backend: the JAX backend; default ``jax.default_backend()``.

  Raises:
    ValueError: for ``"pallas"`` with an interval or payload the kernel does not handle.
  """
  check_impl(impl)
  fits = scaled_matmul_pallas.supports_interval(interval) and all(
      scaled_matmul_pallas.supports_payload(d) for d in payload_dtypes)
  if impl == "auto":
    return "pallas" if fits and placement.kernels_allowed(backend) else "xla"
  if impl == "pallas" and not fits:
    raise ValueError(f"the Pallas kernel does not handle promotion intervals of {interval} "
                     f"elements or payloads of {[str(jnp.dtype(d)) for d in payload_dtypes]}")
  return impl


def scaled_matmul(a: qtensor.QTensor, bt: qtensor.QTensor,
                  acc: Accumulation = FP32, impl: str = "auto",
                  fp8_mma: bool = False) -> jax.Array:
  """Blockwise-scaled FP8 product of contraction-last operands.

  Args:
    a: quantized [B, M, K].
    bt: quantized [B, N, K].
    acc: the accumulator model.
    impl: FP32 mode only: ``"auto"``, ``"xla"`` or ``"pallas"`` (see :func:`fp32_impl`;
      ``"pallas"`` runs interpreted off GPU). ``fp8jax.gemm.dense`` passes
      ``GemmConfig.impl``.
    fp8_mma: where the Pallas kernel runs on E4M3 (or E5M2) payloads of one format, its
      products on the FP8 tensor cores (``scaled_matmul_pallas(fp8_dots=True)``;
      ``GemmConfig.fp8_mma``); elsewhere exact products, as without it.

  Returns:
    float32 [B, M, N].
  """
  for name, value in (("a", a), ("bt", bt)):
    if not isinstance(value, qtensor.QTensor):
      raise TypeError(f"scaled_matmul: {name} must be a QTensor (from fp8jax.quantize), got "
                      f"{type(value).__name__}")
  if not isinstance(acc, Accumulation):
    raise TypeError(f"scaled_matmul: acc must be an Accumulation (e.g. "
                    f"fp8jax.gemm.accumulate.FP32), got {type(acc).__name__} {acc!r}")
  if a.data.ndim != 3 or bt.data.ndim != 3 or a.shape[0] != bt.shape[0] or \
      a.shape[2] != bt.shape[2]:
    raise ValueError(f"scaled_matmul needs A [B, M, K] and Bt [B, N, K], got {a.shape} "
                     f"and {bt.shape}")
  y = _scaled_matmul(a, bt, acc, impl, fp8_mma)
  if a.tensor_scale_inv is None and bt.tensor_scale_inv is None:
    return y
  # Two-level (NVFP4) scales: the per-tensor levels scale the output, as a GEMM's alpha;
  # row-scaled levels ([B, M, 1] and [B, N, 1]) scale its rows and columns.
  alpha = jnp.float32(1.0)
  for t, q, swap in ((a.tensor_scale_inv, a, False), (bt.tensor_scale_inv, bt, True)):
    if t is not None:
      alpha = alpha * row_level(t, q.shape, swap)
  return y * alpha


def row_level(t: jax.Array, shape: tuple[int, ...], swap: bool) -> jax.Array:
  """A two-level operand's second level ``t`` (float32) as a factor of its GEMM's output:
  a scalar as it is; a row-scaled level of an operand ``shape`` [..., R, K], which must be
  [..., R, 1] (one per row, constant along the contraction), as it is for the rows of
  the output, or [..., 1, R] (``swap``) for its columns."""
  t = t.astype(jnp.float32)
  if t.ndim == 0:
    return t
  if tuple(t.shape) != (*shape[:-1], 1):
    raise ValueError(f"a GEMM operand {tuple(shape)} needs its row-scaled level per row "
                     f"along the contraction, shape {(*shape[:-1], 1)}, got {tuple(t.shape)}")
  return jnp.swapaxes(t, -1, -2) if swap else t


def _scaled_matmul(a, bt, acc, impl, fp8_mma=False):
  k = a.shape[-1]
  ga, gb = min(_k_block(a), k), min(_k_block(bt), k)
  if acc.mode == "fp32":
    interval = math.gcd(ga, gb)
  else:
    interval = tensor_core_interval(k, acc)
  k_pad = -(-k // interval) * interval
  n_int = k_pad // interval
  sa = _interval_scales(a, interval, n_int)
  sb = _interval_scales(bt, interval, n_int)
  if acc.mode == "fp32":
    if fp32_impl(interval, (a.data.dtype, bt.data.dtype), impl) == "pallas":
      # The payloads go to the kernel as they are (a custom call: no GEMM rewriting).
      fp8_dots = fp8_mma and scaled_matmul_pallas.fp8_dots_apply(a.data.dtype, bt.data.dtype,
                                                                  interval)
      return scaled_matmul_pallas.scaled_matmul_pallas(
          a.data, bt.data, sa, sb, interval=interval, fp8_dots=fp8_dots,
          **(scaled_matmul_pallas.FP8_DOTS if fp8_dots else {}),
          interpret=jax.default_backend() != "gpu")
    # The barrier keeps XLA:GPU's GEMM rewriter from turning convert(fp8) -> dot into a
    # real FP8 cuBLASLt GEMM, whose own accumulation would replace the simulated one.
    a_p, b_p = _dot_payload(a.data), _dot_payload(bt.data)
    dtype = jnp.promote_types(a_p.dtype, b_p.dtype)
    a_p, b_p = lax.optimization_barrier((_pad_k(a_p.astype(dtype), k_pad),
                                         _pad_k(b_p.astype(dtype), k_pad)))
    return _fp32_products(a_p, b_p, sa, sb, interval)
  if impl == "pallas":
    raise ValueError("the Pallas kernel implements FP32 accumulation only")
  a_f, b_f = lax.optimization_barrier((_pad_k(qtensor.payload_f32(a.data), k_pad),
                                       _pad_k(qtensor.payload_f32(bt.data), k_pad)))
  return tensor_core_products(a_f, b_f, sa, sb, interval, acc)
