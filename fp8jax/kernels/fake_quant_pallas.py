"""Pallas (GPU Triton backend) kernel for the fused 1 x t fake-quant round trip.

One program per ``[block_rows, tiles_per_block * t]`` block of a ``[rows, K]`` view of
``x``: it loads the block, takes the amax of every 1 x t tile of the block (``block_rows``
rows times ``tiles_per_block`` tiles), computes the scales with
:func:`fp8jax.scales.compute_scale`, rounds with :func:`fp8jax.formats.round_to_format`
and stores ``x_hat`` in the dtype of ``x``: one read and one write of ``x``. The
arithmetic is :func:`fp8jax.fast_quant.apply_scales`, so the result equals
:func:`fp8jax.fast_quant.quantize_dequantize_fused` bit for bit wherever the backend's
float32 division does (always with power-of-two scales).

Two ways to split a block into its tiles (``split``): ``"loop"`` loads, rounds and stores
each ``[block_rows, t]`` sub-block in turn (a static loop, one load and one store per
tile); ``"reshape"`` loads the whole block once, reshapes it to
``[block_rows, tiles_per_block, t]`` for the per-tile amax and stores it once. Both lower
for the Triton backend; with ``tiles_per_block=1`` they are the same kernel.

Pallas is imported when the kernel is called, not when this module is imported. On
CPU, pass ``interpret=True``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from fp8jax import blocks, fast_quant, scales
from fp8jax import spec as spec_lib


def tile_size(spec: spec_lib.QuantSpec) -> int | None:
  """The tile length ``t`` when ``spec`` is current-scaled 1 x t tiles along the last
  axis with ``t`` a power of two, else None (the kernel does not handle it)."""
  g = spec.granularity
  if spec.scaling != "current" or g.kind != "tile" or g.axes != (-1,):
    return None
  t = g.sizes[0]
  return t if t & (t - 1) == 0 else None


def supports(x_shape: tuple[int, ...], spec: spec_lib.QuantSpec) -> bool:
  """Whether :func:`fake_quant_pallas` handles an input of ``x_shape`` under ``spec``:
  1 x t tiles (see :func:`tile_size`) and a last axis that ``t`` divides."""
  t = tile_size(spec)
  return t is not None and len(x_shape) >= 1 and x_shape[-1] % t == 0 and x_shape[-1] > 0


def _pow2_divisor(n: int, at_most: int) -> int:
  """The largest power of two <= ``at_most`` that divides ``n``."""
  d = 1 << max(int(math.log2(max(at_most, 1))), 0)
  while d > 1 and n % d:
    d //= 2
  return d


def _rows_per_block(rows: int, block_rows: int) -> int:
  """The largest power of two <= ``block_rows`` that divides ``rows``."""
  return _pow2_divisor(rows, block_rows)


def block_shape(x_shape: tuple[int, ...], spec: spec_lib.QuantSpec, block_rows: int = 32,
                tiles_per_block: int = 1) -> tuple[int, int]:
  """The ``(rows, tiles)`` per program that :func:`fake_quant_pallas` uses for an input
  of ``x_shape``: each rounded down to a power of two dividing the number of rows
  ``prod(x_shape[:-1])`` and the number of tiles per row ``K / t`` respectively."""
  t = tile_size(spec)
  if t is None:
    raise ValueError(f"not a 1 x t tile spec: {spec.describe()}")
  rows = math.prod(x_shape[:-1])
  return _rows_per_block(rows, block_rows), _pow2_divisor(x_shape[-1] // t, tiles_per_block)


def _round_tile(x, spec: spec_lib.QuantSpec, dtype, axis: int):
  amax = jnp.max(blocks.finite_abs(x), axis=axis, keepdims=True)
  s, scale_inv = scales.compute_scale(amax, spec)
  return fast_quant.apply_scales(x, s, scale_inv, spec.fmt, dtype)


def _kernel_loop(x_ref, o_ref, *, spec: spec_lib.QuantSpec, t: int, tiles: int):
  if tiles == 1:
    o_ref[...] = _round_tile(x_ref[...], spec, o_ref.dtype, 1)  # [bm, t]
    return
  from jax.experimental import pallas as pl

  for j in range(tiles):  # static: one load and one store of [bm, t] per tile
    cols = pl.ds(j * t, t)
    o_ref[:, cols] = _round_tile(x_ref[:, cols], spec, o_ref.dtype, 1)


def _kernel_reshape(x_ref, o_ref, *, spec: spec_lib.QuantSpec, t: int, tiles: int):
  x = x_ref[...]  # [bm, tiles * t]
  bm = x.shape[0]
  y = _round_tile(x.reshape(bm, tiles, t), spec, o_ref.dtype, 2)
  o_ref[...] = y.reshape(bm, tiles * t)


_KERNELS = {"loop": _kernel_loop, "reshape": _kernel_reshape}


def fake_quant_pallas(x: jax.Array, spec: spec_lib.QuantSpec, *, block_rows: int = 32,
                      tiles_per_block: int = 1, num_warps: int | None = None,
                      split: str = "loop", interpret: bool = False) -> jax.Array:
  """Fake-quantizes ``x`` with 1 x t tiles along its last axis in one Pallas kernel.

  Args:
    x: float32, bfloat16 or float16 array ``[..., K]`` with ``K % t == 0``.
    spec: current scaling, ``tile(t, -1)`` granularity with ``t`` a power of two, any
      format and scale rule.
    block_rows: rows per program (rounded down to a power of two dividing the number
      of rows ``prod(x.shape[:-1])``).
    tiles_per_block: 1 x t tiles per row of a program's block, i.e. ``tiles_per_block * t``
      columns per program (rounded down to a power of two dividing ``K / t``).
    num_warps: Triton warps per program (None: the Pallas default).
    split: how a program splits its block into tiles, ``"loop"`` or ``"reshape"`` (see
      the module docstring); the same result either way.
    interpret: run the kernel with the Pallas interpreter (CPU tests).

  Returns:
    ``x_hat`` with the shape and dtype of ``x``.
  """
  if not supports(tuple(x.shape), spec):
    raise ValueError(
        f"fake_quant_pallas needs current-scaled 1 x t tiles along the last axis (t a power "
        f"of two dividing it); got {spec.describe()} for shape {tuple(x.shape)}")
  if not jnp.issubdtype(x.dtype, jnp.floating) or jnp.dtype(x.dtype).itemsize == 1:
    raise TypeError(f"quantize needs a 16- or 32-bit float input, got dtype {x.dtype}")
  if split not in _KERNELS:
    raise ValueError(f"split must be one of {sorted(_KERNELS)}, got {split!r}")
  from jax.experimental import pallas as pl  # lazy: no import-time cost

  t = tile_size(spec)
  k = x.shape[-1]
  rows = math.prod(x.shape[:-1])
  bm, tiles = block_shape(tuple(x.shape), spec, block_rows, tiles_per_block)
  bn = tiles * t
  x2 = x.reshape(rows, k)
  compiler_params = None
  if num_warps is not None and not interpret:
    from jax.experimental.pallas import triton as pl_triton
    compiler_params = pl_triton.CompilerParams(num_warps=num_warps)
  spec_block = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
  out = pl.pallas_call(
      functools.partial(_KERNELS[split], spec=spec, t=t, tiles=tiles),
      out_shape=jax.ShapeDtypeStruct((rows, k), x.dtype),
      grid=(rows // bm, k // bn),
      in_specs=[spec_block],
      out_specs=spec_block,
      compiler_params=compiler_params,
      interpret=interpret,
      name="fp8jax_fake_quant",
  )(x2)
  return out.reshape(x.shape)


__all__ = ["block_shape", "fake_quant_pallas", "supports", "tile_size"]
