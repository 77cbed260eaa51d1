"""How the grouped GEMM's row operands are laid out and quantized for its kernels.

X (forward) and dY (backward) each enter two GEMMs of :func:`fp8jax.gemm.grouped.fp8_ragged_dot`:
Fprop or Dgrad read them in 1 x t tiles along their columns, Wgrad in 1 x t tiles along the
tokens. Each expert's weight is quantized once for Fprop and Dgrad where its scale blocks
are square (:func:`weight_once`). Wgrad's quantization can stay in the rows' layout
(:func:`rows_first`, no transposed copy) or be transposed, the layout the FP8 tensor cores
read (:func:`fp8_wgrad`). In the padded layout on the kernels, :func:`one_pass` quantizes
each operand both ways in one read (:mod:`fp8jax.kernels.tile_quant_pallas`), with the bits
of the separate quantizations.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.gemm import dense as gemm_lib
from fp8jax.gemm import operand_telemetry, operands
from fp8jax.kernels import block_quant_pallas, placement, tile_quant_pallas
from fp8jax.kernels import scaled_matmul_pallas as smp
from fp8jax.quant import qtensor


def kernels_on(cfg: gemm_lib.GemmConfig) -> bool:
  """Whether ``cfg``'s products may run in the Pallas kernels here: FP32 accumulation and
  ``impl`` "pallas" (interpreted off GPU), or "auto" on one GPU."""
  return cfg.accumulation.mode == "fp32" and (
      cfg.impl == "pallas" or (cfg.impl == "auto" and placement.kernels_allowed()))


def rows_first(cfg: gemm_lib.GemmConfig) -> bool:
  """Whether Wgrad's operands may stay in the rows' layout, X [N, K] and dY [N, F] quantized
  in blocks of rows (``transpose.quantize_columns``) instead of transposed: the requant
  policy without a Hadamard transform, rounding to nearest, without a noise control (whose
  noise, like stochastic rounding's bits, is drawn in the layout quantized), X^T from the
  original X (not ``from_forward``). Also the condition of :func:`one_pass`."""
  specs = (cfg.roles.operand("wgrad", "input"), cfg.roles.operand("wgrad", "grad"))
  return (cfg.transpose == "requant" and not cfg.wgrad_hadamard and not cfg.from_forward
          and all(s.rounding == "nearest" and not s.noise_control for s in specs))


def _tile(cfg: gemm_lib.GemmConfig) -> int | None:
  """The one 1 x t tile spec of Wgrad's copies of X and dY that the kernels take, else
  None."""
  r, tile_of = cfg.roles, tile_quant_pallas.tile_of
  t = tile_of(r.operand("wgrad", "input"))
  return t if t is not None and tile_of(r.operand("wgrad", "grad")) == t else None


def fp8_wgrad(cfg: gemm_lib.GemmConfig) -> bool:
  """Whether Wgrad's kernel multiplies the FP8 payloads (``cfg.fp8_mma``): the operands
  then come transposed, the layout the FP8 MMA reads (rows first, Triton transposes them
  and the kernel is the slower:
  docs/performance/archive/2026-11-26_grouped_blockwise_fp8_dots.md)."""
  t = _tile(cfg)
  x, dy = cfg.roles.operand("wgrad", "input"), cfg.roles.operand("wgrad", "grad")
  return (cfg.fp8_mma and kernels_on(cfg) and t is not None
          and smp.fp8_dots_apply(x.fmt.storage_dtype, dy.fmt.storage_dtype, t))


def one_pass(cfg: gemm_lib.GemmConfig, layout: int, n: int, k: int, f: int) -> bool:
  """Whether X [N, K] and dY [N, F] are each quantized for both of their GEMMs in one read
  (:func:`both_ways`): all three directions in FP8 on the kernels, :func:`rows_first`, one
  tile spec the kernel takes for both, groups laid out at whole tiles (``layout``, the
  model's padding) and a conversion that rounds as XLA's does, each second copy the first's
  quantization transposed. The forward pass then keeps X^T's 8-bit quantization for Wgrad
  instead of X."""
  t = _tile(cfg)
  r, tq = cfg.roles, tile_quant_pallas
  same = not (operands.second_copies_differ(cfg, "input")
              or operands.second_copies_differ(cfg, "grad"))
  return (cfg.fprop == cfg.dgrad == cfg.wgrad == "fp8" and kernels_on(cfg) and same
          and rows_first(cfg) and t is not None and layout % t == 0
          and tq.supports((n, k), r.input) and tq.supports((n, f), r.grad)
          and tq.rounds_exactly())


def weight_once(cfg: gemm_lib.GemmConfig) -> bool:
  """Whether each expert's weight W_e [K, F] is quantized once, in its own layout, for both
  Fprop (which reads it as W_e^T [F, K]) and Dgrad (contraction over F): FP8 Fprop and
  Dgrad on the kernels, square scale blocks (``b x b``: the blocks of W_e and of W_e^T are
  the same elements, so one quantization is the other's transpose, bit for bit), rounding
  to nearest without a noise control, W^T's copy the same quantization (its spec W's, not
  ``from_forward``), and a transpose policy that quantizes W_e itself
  ("requant") or leaves square blocks as they are ("scaling_aware", for the specs it
  takes; a block holding NaN gives NaN outputs either way). The forward pass then
  keeps the 8-bit weight for the backward one instead of quantizing it twice more: one
  byte per weight element more memory until the backward pass (217 MB per 2B MoE layer)."""
  spec, g = cfg.roles.weight, cfg.roles.weight.granularity
  axes = sorted(a - 2 if a >= 0 else a for a in g.axes)
  square = g.kind == "block" and axes == [-2, -1] and len(set(g.sizes)) == 1
  # what transpose.scaling_aware_transpose accepts (it refuses the others)
  scaling_aware = (spec.scaling == "current" and not spec.two_level
                   and spec.fmt.has_nan)
  return (cfg.fprop == cfg.dgrad == "fp8" and kernels_on(cfg) and square
          and not operands.second_copies_differ(cfg, "weight")
          and spec.rounding == "nearest" and not spec.noise_control
          and (cfg.transpose == "requant"
               or (cfg.transpose == "scaling_aware" and scaling_aware)))


def fprop_reads_transposed(fp8_dots: bool) -> bool:
  """Whether Fprop's kernel reads the once-quantized weight [E, K, F] as it is (else XLA
  swaps its 8-bit payload to [E, F, K] first; the same bits). Not with FP8 dots: the FP8
  MMA reads its operands K-major: on Hopper the Fprop kernels reading W as it is were
  slower than the Dgrad kernels of the same sizes, which read it K-major. With bfloat16
  dots reading W as it is was the faster (``scripts/bench/weight_once.py``; the profiles:
  docs/performance/archive/2026-11-26_pair_weight_once_compare.md)."""
  return not fp8_dots


def _block_kernel(cfg: gemm_lib.GemmConfig, shape) -> bool:
  """Whether the once-quantized weights of ``shape`` [E, K, F] come from the one-read
  kernel (:mod:`fp8jax.kernels.block_quant_pallas`, interpreted off GPU)."""
  return (kernels_on(cfg) and block_quant_pallas.supports(tuple(shape), cfg.roles.weight)
          and block_quant_pallas.rounds_exactly())


def _from_kernel(w, cfg, in_dtype, stats: bool):
  spec = cfg.roles.weight
  data, scale_inv, block_stats = block_quant_pallas.quantize_blocks(
      w, spec, in_dtype=in_dtype, stats=stats, interpret=jax.default_backend() != "gpu")
  b = block_quant_pallas.block_of(spec)
  return qtensor.QTensor(data, scale_inv, (b, b), jnp.dtype(in_dtype or w.dtype)), block_stats


def weight_quantized_once(w: jax.Array, cfg: gemm_lib.GemmConfig) -> qtensor.QTensor | None:
  """Each expert's weight of ``w`` [E, K, F] quantized on its own, in its own layout, for
  both Fprop and Dgrad where :func:`weight_once` holds, else None; in one read where the
  kernel takes the spec (:func:`weights_once`)."""
  if not weight_once(cfg):
    return None
  if _block_kernel(cfg, w.shape):
    return _from_kernel(w, cfg, None, False)[0]
  spec = cfg.roles.weight
  # Materialized: fused into its consumers, XLA quantized W once more for the swapped
  # payload (reading float32 W transposed) instead of swapping the 8-bit one.
  return lax.optimization_barrier(jax.vmap(lambda m: qtensor.quantize(m, spec))(w))


def weights_once(w: jax.Array, cfg: gemm_lib.GemmConfig, dtype, telemetry: bool = True
                 ) -> tuple[qtensor.QTensor, dict[str, jax.Array] | None]:
  """``weight_quantized_once(w.astype(dtype), cfg)`` and, with ``telemetry``, its operand
  telemetry sums (:func:`fp8jax.gemm.operand_telemetry.sums_of_blocks`, each expert a
  tensor of its own), for a caller that passes the quantization to ``fp8_ragged_dot(...,
  w_once=)``. Where the kernel takes the spec it reads ``w`` (float32 parameters) once for
  both, rounding to ``dtype`` in the kernel; else XLA quantizes ``w.astype(dtype)`` and
  takes the statistics of its blocks. Requires :func:`weight_once` (``cfg``)."""
  if not weight_once(cfg):
    raise ValueError(f"weights_once needs a config whose weights are quantized once "
                     f"(grouped_operands.weight_once); got {cfg.describe()}")
  w = lax.stop_gradient(w)
  if _block_kernel(cfg, w.shape):
    qt, stats = _from_kernel(w, cfg, jnp.dtype(dtype), telemetry)
  elif not telemetry:
    return weight_quantized_once(w.astype(dtype), cfg), None
  else:
    spec = cfg.roles.weight
    qt, stats = jax.vmap(lambda m: operand_telemetry.block_stats(m, spec))(w.astype(dtype))
    qt = lax.optimization_barrier(qt)  # as weight_quantized_once
  return qt, (operand_telemetry.sums_of_blocks(qt, stats, experts=True) if telemetry
              else None)


def both_ways(x: jax.Array, spec) -> tuple[qtensor.QTensor, qtensor.QTensor]:
  """``quantize(x, spec)`` and ``quantize(x.T, spec)`` for x [N, K], from one kernel
  (interpreted off GPU)."""
  t = tile_quant_pallas.tile_of(spec)
  q, s, qt, st = tile_quant_pallas.quantize_rows_and_columns(
      x, spec, interpret=jax.default_backend() != "gpu")
  return (qtensor.QTensor(q, s, (1, t), x.dtype),
          qtensor.QTensor(qt, jnp.swapaxes(st, 0, 1), (1, t), x.dtype))


__all__ = ["both_ways", "fp8_wgrad", "kernels_on", "one_pass", "rows_first",
           "weight_once", "weight_quantized_once", "weights_once"]
