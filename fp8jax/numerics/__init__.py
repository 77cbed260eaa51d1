"""Element formats and scales: what a low-precision number is and how blocks share a scale.

The bottom layer of fp8jax; it imports nothing else from the package.

* :mod:`~fp8jax.numerics.formats`: the element formats (FP8, FP6, FP4), their grids, the
  saturating cast, rounding by integer arithmetic and stochastic rounding;
* :mod:`~fp8jax.numerics.granularity` and :mod:`~fp8jax.numerics.blocks`: which elements
  share a scale (per tensor, per axis, 1 x N tiles, N x M blocks) and the block amax;
* :mod:`~fp8jax.numerics.spec`: :class:`QuantSpec`, a static, hashable description of one
  quantization;
* :mod:`~fp8jax.numerics.scales`: amax -> scale (FP32, power of two / E8M0 by the OCP or
  the round-up rule, two-level E4M3 or UE5M3 + FP32, per tensor or per row, for NVFP4) and
  the elementwise round trip; :mod:`~fp8jax.numerics.ue5m3` the UE5M3 block-scale format;
* :mod:`~fp8jax.numerics.presets` and :mod:`~fp8jax.numerics.roles`: named specs and the
  per-GEMM-role specs of a recipe.

Import the modules directly; nothing is imported here.
"""
