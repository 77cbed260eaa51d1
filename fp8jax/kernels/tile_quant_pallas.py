"""Pallas (GPU Triton backend): rows quantized two ways in one read.

A grouped GEMM needs its row operand (X in the forward pass, dY in the backward pass)
quantized twice with the same 1 x t tile spec: along its columns for Fprop or Dgrad, and
transposed, along its rows, for Wgrad (the contraction runs over the tokens). XLA does
this in four passes over the rows (two tile amaxes, two quantizations, one of them into the
transposed layout). :func:`quantize_rows_and_columns` does it in one:

Program ``(i, j)`` loads the ``[t, t]`` block of ``x [N, K]`` at rows ``i t`` and columns
``j t`` and takes two amaxes of it (:func:`fp8jax.numerics.blocks.amax_abs`): per row,
the 1 x t tile of the rows' quantization; per column, the t x 1 block that is a 1 x t
tile of ``x^T``. It computes both sets of scales with
:func:`fp8jax.numerics.scales.compute_scale` and stores

* the rows' payload ``[N, K]`` and ``scale_inv [N, K / t]``;
* the transposed payload ``[K, N]`` (its block written at ``(j t, i t)``) and its
  ``scale_inv`` as ``[N / t, K]``, one row per interval of t rows: the layout the Wgrad
  kernel reads (:func:`fp8jax.kernels.grouped_scaled_pallas.grouped_scaled_wgrad`).

The payloads are rounded by the FP8 conversion, ``clip(x * s, -max, max)`` cast to
E4M3 or E5M2, which :func:`fp8jax.numerics.formats.saturating_cast` is (on sm_90+ Triton
converts with ``cvt.rn.satfinite``, round to nearest even; see
:mod:`fp8jax.kernels.fake_quant_pallas`). NaN is selected back after the clip (Triton's
min and max drop it). Both results equal ``qtensor.quantize(x, spec)`` and
``qtensor.quantize(x.T, spec)`` bit for bit where the backend's float32 division does, as
the fused fake-quant kernel does (``tests/kernels/test_tile_quant_pallas.py`` on the CPU;
``scripts/bench/tile_quant.py`` on the GPU, with E4M3: the recipes' format).

Pallas is imported when the kernel is called; on CPU pass ``interpret=True``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fp8jax.kernels import fake_quant_pallas, placement
from fp8jax.numerics import blocks, scales
from fp8jax.numerics import spec as spec_lib

FORMATS = fake_quant_pallas.CAST_FORMATS  # rounded exactly by Triton's FP8 conversion (sm_90+)


def tile_of(spec: spec_lib.QuantSpec) -> int | None:
  """The tile length t when the kernel handles ``spec``: current scaling with float32
  scales, 1 x t tiles along the last axis (t a power of two from 16 to 128), round to
  nearest, E4M3 or E5M2, no noise control; else None."""
  g = spec.granularity
  if (spec.scaling != "current" or spec.scale_format != "fp32" or spec.rounding != "nearest"
      or spec.noise_control or spec.fmt.name not in FORMATS):
    return None
  if g.kind != "tile" or tuple(g.axes) != (-1,):
    return None
  t = g.sizes[0]
  return t if 16 <= t <= 128 and t & (t - 1) == 0 else None


def supports(shape: tuple[int, ...], spec: spec_lib.QuantSpec) -> bool:
  """Whether :func:`quantize_rows_and_columns` takes ``x`` of ``shape`` under ``spec``:
  a 2-D ``[N, K]`` with both sides whole tiles (see :func:`tile_of`)."""
  t = tile_of(spec)
  return (t is not None and len(shape) == 2 and shape[0] > 0 and shape[1] > 0
          and shape[0] % t == 0 and shape[1] % t == 0)


def rounds_exactly() -> bool:
  """Whether the kernel's FP8 conversion rounds to nearest even here: off GPU (interpreted,
  XLA's conversion) or on compute capability 9.0 or newer (below it Triton converts
  through float16 rounded toward zero)."""
  return jax.default_backend() != "gpu" or placement.capability_at_least(9)


def saturating_payload(v, fmt):
  """``saturating_cast`` of the scaled float32 ``v`` with NaN kept (Triton's clip drops it)."""
  clipped = jnp.clip(v, -fmt.max, fmt.max)
  return jnp.where(jnp.isnan(v), v, clipped).astype(fmt.dtype)


def _kernel(x_ref, q_ref, s_ref, qt_ref, st_ref, *, spec: spec_lib.QuantSpec):
  x = x_ref[...].astype(jnp.float32)  # [t, t]
  a = blocks.amax_abs(x)
  fmt = spec.fmt
  s_row, inv_row = scales.compute_scale(jnp.max(a, axis=1, keepdims=True), spec)  # [t, 1]
  q_ref[...] = saturating_payload(x * s_row, fmt)
  s_ref[...] = inv_row
  s_col, inv_col = scales.compute_scale(jnp.max(a, axis=0, keepdims=True), spec)  # [1, t]
  qt_ref[...] = saturating_payload(x * s_col, fmt).T
  st_ref[...] = inv_col


def quantize_rows_and_columns(x: jax.Array, spec: spec_lib.QuantSpec, *,
                              num_warps: int = 4, interpret: bool = False
                              ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """The payloads and scales of ``quantize(x, spec)`` and ``quantize(x.T, spec)`` in one
  pass over ``x``.

  Args:
    x: [N, K] float32, bfloat16 or float16, N and K multiples of the tile t.
    spec: a spec :func:`tile_of` accepts (DeepSeek-V3's E4M3 1 x 128 tiles).
    num_warps: Triton warps per ``[t, t]`` program.
    interpret: run in the Pallas interpreter (CPU tests).

  Returns:
    ``(rows [N, K], rows_scale_inv [N, K / t], cols [K, N], cols_scale_inv [N / t, K])``:
    the rows' payload and float32 scales (1 x t blocks), and those of x^T with its scales
    one row per interval of t rows (the transpose of ``quantize(x.T).scale_inv``).
  """
  if not supports(tuple(x.shape), spec):
    raise ValueError(
        f"quantize_rows_and_columns needs x [N, K] with N and K multiples of the tile and a "
        f"current-scaled E4M3/E5M2 1 x t tile spec with float32 scales, round to nearest; "
        f"got shape {tuple(x.shape)} and {spec.describe()}")
  if not jnp.issubdtype(x.dtype, jnp.floating) or jnp.dtype(x.dtype).itemsize == 1:
    raise TypeError(f"quantize_rows_and_columns needs a 16- or 32-bit float input, got "
                    f"{x.dtype}")
  if not interpret and not rounds_exactly():
    raise ValueError("quantize_rows_and_columns needs a GPU of compute capability 9.0 or "
                     "newer, where Triton's FP8 conversion rounds to nearest even")
  from jax.experimental import pallas as pl

  t = tile_of(spec)
  n, k = x.shape
  dtype = spec.fmt.dtype
  params = None
  if not interpret:
    from jax.experimental.pallas import triton as plgpu
    params = plgpu.CompilerParams(num_warps=num_warps)
  return pl.pallas_call(
      functools.partial(_kernel, spec=spec),
      out_shape=(jax.ShapeDtypeStruct((n, k), dtype),
                 jax.ShapeDtypeStruct((n, k // t), jnp.float32),
                 jax.ShapeDtypeStruct((k, n), dtype),
                 jax.ShapeDtypeStruct((n // t, k), jnp.float32)),
      grid=(n // t, k // t),
      in_specs=[pl.BlockSpec((t, t), lambda i, j: (i, j))],
      out_specs=(pl.BlockSpec((t, t), lambda i, j: (i, j)),
                 pl.BlockSpec((t, 1), lambda i, j: (i, j)),
                 pl.BlockSpec((t, t), lambda i, j: (j, i)),
                 pl.BlockSpec((1, t), lambda i, j: (i, j))),
      compiler_params=params,
      interpret=interpret,
      name="fp8jax_quantize_rows_and_columns",
  )(x)


__all__ = ["FORMATS", "quantize_rows_and_columns", "rounds_exactly", "saturating_payload",
           "supports", "tile_of"]
