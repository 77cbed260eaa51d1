"""The simulated low-precision GEMM, built on :mod:`fp8jax.quant`.

* :mod:`~fp8jax.gemm.dense`: ``fp8_dot_general`` / ``fp8_einsum`` with a custom VJP for the
  three GEMMs of a layer (Fprop, Dgrad, Wgrad) and :class:`GemmConfig`;
* :mod:`~fp8jax.gemm.accumulate`: FP32 or tensor-core accumulation with promotion, scales
  applied per K interval;
* :mod:`~fp8jax.gemm.transpose`: how the transposed operands of the backward GEMMs are
  produced (requantize, double quantization, scaling-aware);
* :mod:`~fp8jax.gemm.grouped`: the grouped (per-expert) GEMM of the MoE layer.

Import the modules directly; nothing is imported here.
"""
