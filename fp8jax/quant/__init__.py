"""Quantize ops over arrays, built on :mod:`fp8jax.numerics` (and the kernels on GPU).

* :mod:`~fp8jax.quant.qtensor`: ``quantize`` / ``dequantize`` with an explicit payload and
  scales (:class:`QTensor`);
* :mod:`~fp8jax.quant.fake_quant`: the differentiable round trip (``jax.custom_vjp``:
  straight-through or a cotangent spec), with telemetry;
* :mod:`~fp8jax.quant.fused_round_trip`: the fused round trip without a payload;
* :mod:`~fp8jax.quant.delayed`: delayed scaling (amax histories as explicit state);
* :mod:`~fp8jax.quant.rounding_bits`: random bits for stochastic rounding (keyed, or
  derived from the tensor);
* :mod:`~fp8jax.quant.telemetry`: per-quantization statistics.

Import the modules directly; nothing is imported here.
"""
