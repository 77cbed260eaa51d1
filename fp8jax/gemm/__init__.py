"""The simulated low-precision GEMM, built on :mod:`fp8jax.quant`.

* :mod:`~fp8jax.gemm.dense`: ``fp8_dot_general`` / ``fp8_einsum`` with a custom VJP for the
  three GEMMs of a layer (Fprop, Dgrad, Wgrad) and :class:`GemmConfig`;
* :mod:`~fp8jax.gemm.accumulate`: FP32 or tensor-core accumulation with promotion, scales
  applied per K interval;
* :mod:`~fp8jax.gemm.transpose`: how the transposed operands of the backward GEMMs are
  produced (requantize, double quantization, scaling-aware);
* :mod:`~fp8jax.gemm.grouped`: the grouped (per-expert) GEMM of the MoE layer;
* :mod:`~fp8jax.gemm.grouped_tensor_core`: its tensor-core accumulation, per expert;
* :mod:`~fp8jax.gemm.hadamard`: the random Hadamard transform of the NVFP4 recipe's Wgrad;
* :mod:`~fp8jax.gemm.recipes`: named recipes (DeepSeek-V3 blockwise, FP8 per-tensor,
  MXFP8, MXFP4, NVFP4 and the NVFP4 training recipe).

Import the modules directly; nothing is imported here.
"""
