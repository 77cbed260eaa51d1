"""GPU kernels (Pallas) that the ops above choose on GPUs; interpreted on CPU in the tests.

They take arrays and :class:`~fp8jax.numerics.spec.QuantSpec` objects and import only
:mod:`fp8jax.numerics` (and :mod:`~fp8jax.kernels.placement`, which decides where a kernel
runs). Import the modules directly; nothing is imported here.
"""
