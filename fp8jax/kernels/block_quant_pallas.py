"""Pallas (GPU Triton backend): stacked matrices quantized in square blocks in one read.

The grouped GEMM's expert weights ``w [E, R, C]`` are quantized each in ``b x b`` blocks
(DeepSeek-V3's 128 x 128). XLA takes two passes over ``w`` (the block amaxes, then the
quantization) and the operand telemetry more of its own. :func:`quantize_blocks` reads
each block once: program ``(e, i, j)`` loads the ``[b, b]`` block of ``w[e]`` at rows
``i b`` and columns ``j b``, takes its amax (:func:`fp8jax.numerics.blocks.amax_abs`) and
scale (:func:`fp8jax.numerics.scales.compute_scale`), and stores the payload
``clip(x * s, -max, max)`` cast to E4M3 or E5M2 (round to nearest even on sm_90+, as in
:mod:`fp8jax.kernels.tile_quant_pallas`; NaN selected back after the clip) and
``scale_inv``. With ``stats`` it also stores, per block, what the operand telemetry
(:mod:`fp8jax.gemm.operand_telemetry`) sums:

* ``amax``: the block's amax as above (+inf for a block holding NaN or ±inf);
* ``saturated``: 1 where an element of ``x * s`` rounds past the format's largest value
  (``|x * s|`` above the midpoint between max and max + ulp(max); on it when max's last
  mantissa bit is odd);
* ``flushed``: 1 where a finite nonzero element has a zero payload;
* ``finite``: the count of finite elements;
* ``sum_q2`` / ``sum_q4``: sums of ``q^2`` and ``q^4`` over the dequantized block
  ``q = payload * scale_inv`` (saturated at the float32 maximum, NaN counted as 0, as
  ``qtensor.dequantize`` and the telemetry do; float32, summed within the block in the
  kernel's order).

``in_dtype`` rounds the input to that dtype first (as ``w.astype(in_dtype)`` would), so
a float32 parameter is read once and quantized as the bfloat16 weight the model computes
with. The payload and scales equal ``qtensor.quantize`` of each ``w[e]`` bit for bit
wherever Triton's float32 division (``max / amax``, ``1 / s``) rounds as XLA's does:
``tests/kernels/test_block_quant_pallas.py`` on the CPU, ``scripts/bench/block_quant.py`` on an
H100 (equal on every benchmark weight and on weights spanning 2^-60..2^60).

Pallas is imported when the kernel is called; on CPU pass ``interpret=True``.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.kernels import fake_quant_pallas
from fp8jax.kernels.tile_quant_pallas import (
  rounds_exactly,  # noqa: F401  (this API too)
  saturating_payload,
)
from fp8jax.numerics import blocks, formats, scales
from fp8jax.numerics import spec as spec_lib

FORMATS = fake_quant_pallas.CAST_FORMATS
STATS = ("amax", "saturated", "flushed", "finite", "sum_q2", "sum_q4")
"""The per-block statistics :func:`quantize_blocks` stores with ``stats`` (float32)."""


def block_of(spec: spec_lib.QuantSpec) -> int | None:
  """The block side b when the kernel handles ``spec``: current scaling with float32
  scales, ``b x b`` blocks over the last two axes (b a power of two from 16 to 128),
  round to nearest, E4M3 or E5M2, no noise control; else None."""
  g = spec.granularity
  if (spec.scaling != "current" or spec.scale_format != "fp32" or spec.rounding != "nearest"
      or spec.noise_control or spec.fmt.name not in FORMATS or g.kind != "block"):
    return None
  axes = sorted(a - 2 if a >= 0 else a for a in g.axes)
  if axes != [-2, -1] or len(set(g.sizes)) != 1:
    return None
  b = g.sizes[0]
  return b if 16 <= b <= 128 and b & (b - 1) == 0 else None


def supports(shape: tuple[int, ...], spec: spec_lib.QuantSpec) -> bool:
  """Whether :func:`quantize_blocks` takes ``w`` of ``shape`` under ``spec``: a 3-D
  ``[E, R, C]`` with R and C whole blocks (see :func:`block_of`)."""
  b = block_of(spec)
  return (b is not None and len(shape) == 3 and all(d > 0 for d in shape)
          and shape[1] % b == 0 and shape[2] % b == 0)


def _kernel(x_ref, q_ref, s_ref, *stat_refs, spec: spec_lib.QuantSpec, in_dtype):
  x = x_ref[...]
  if in_dtype is not None:
    x = x.astype(in_dtype)
  x = x.astype(jnp.float32)  # [b, b]
  amax = jnp.max(blocks.amax_abs(x))
  s, inv = scales.compute_scale(amax, spec)
  fmt = spec.fmt
  scaled = x * s
  payload = saturating_payload(scaled, fmt)
  q_ref[...] = payload
  s_ref[...] = jnp.full((1, 1), inv, jnp.float32)
  if not stat_refs:
    return
  one, zero = jnp.float32(1), jnp.float32(0)
  p = payload.astype(jnp.float32)
  flushed = jnp.isfinite(x) & (x != 0) & (p == 0)
  q = p * inv  # as qtensor.dequantize: an overflow saturates at the float32 maximum
  top = jnp.float32(jnp.finfo(jnp.float32).max)
  q = jnp.where(jnp.isnan(q), zero, jnp.clip(q, -top, top))
  q2 = q * q

  def finite_block():
    # |x * s| rounds monotonically in |x|: the largest is amax * s (subnormals, which the
    # amax reads as 0, scale far below the format's range)
    return (jnp.where(formats.saturates(amax * s, fmt), one, zero),
            amax * 0 + x.size)  # a traced value: Triton's branches yield no constants

  def other_block():  # NaN or inf: element by element
    return (jnp.max(jnp.where(formats.saturates(jnp.abs(scaled), fmt), one, zero)),
            jnp.sum(jnp.where(jnp.isfinite(x), one, zero)))

  saturated, finite = lax.cond(amax < jnp.inf, finite_block, other_block)
  values = {"amax": amax, "saturated": saturated,
            "flushed": jnp.max(jnp.where(flushed, one, zero)), "finite": finite,
            "sum_q2": jnp.sum(q2), "sum_q4": jnp.sum(q2 * q2)}
  for name, ref in zip(STATS, stat_refs):
    ref[...] = jnp.full((1, 1), values[name], jnp.float32)


def quantize_blocks(w: jax.Array, spec: spec_lib.QuantSpec, *, in_dtype=None,
                    stats: bool = False, num_warps: int = 8, interpret: bool = False):
  """Each ``w[e]`` quantized in ``b x b`` blocks, in one pass over ``w``.

  Args:
    w: [E, R, C] float32, bfloat16 or float16, R and C multiples of the block side b.
    spec: a spec :func:`block_of` accepts (DeepSeek-V3's E4M3 128 x 128 blocks).
    in_dtype: a 16- or 32-bit float dtype ``w`` is rounded to first (None: as it is).
    stats: also return the per-block statistics of the module docstring.
    num_warps: Triton warps per ``[b, b]`` program.
    interpret: run in the Pallas interpreter (CPU tests).

  Returns:
    ``(payload [E, R, C], scale_inv float32 [E, R / b, C / b], stats)``: ``stats`` a dict
    of float32 [E, R / b, C / b] arrays named by :data:`STATS`, or None.
  """
  if block_of(spec) is None:
    raise ValueError(f"quantize_blocks needs a current-scaled E4M3/E5M2 square-block spec "
                     f"with float32 scales, round to nearest; got {spec.describe()}")
  if not supports(tuple(w.shape), spec):
    raise ValueError(f"quantize_blocks needs w [E, R, C] with R and C multiples of the "
                     f"{block_of(spec)}-element block; got shape {tuple(w.shape)}")
  for name, dt in (("w", w.dtype), ("in_dtype", in_dtype)):
    if dt is not None and (not jnp.issubdtype(dt, jnp.floating)
                           or jnp.dtype(dt).itemsize == 1):
      raise TypeError(f"quantize_blocks needs a 16- or 32-bit float {name}, got {dt}")
  if not interpret and not rounds_exactly():
    raise ValueError("quantize_blocks needs a GPU of compute capability 9.0 or newer, "
                     "where Triton's FP8 conversion rounds to nearest even")
  from jax.experimental import pallas as pl

  b = block_of(spec)
  e, r, c = w.shape
  grid = (e, r // b, c // b)
  small = jax.ShapeDtypeStruct((e, r // b, c // b), jnp.float32)
  one = pl.BlockSpec((None, 1, 1), lambda g, i, j: (g, i, j))
  n_stats = len(STATS) if stats else 0
  params = None
  if not interpret:
    from jax.experimental.pallas import triton as plgpu
    params = plgpu.CompilerParams(num_warps=num_warps)
  out = pl.pallas_call(
      functools.partial(_kernel, spec=spec,
                        in_dtype=None if in_dtype is None else jnp.dtype(in_dtype)),
      out_shape=(jax.ShapeDtypeStruct((e, r, c), spec.fmt.dtype), small,
                 *([small] * n_stats)),
      grid=grid,
      in_specs=[pl.BlockSpec((None, b, b), lambda g, i, j: (g, i, j))],
      out_specs=(pl.BlockSpec((None, b, b), lambda g, i, j: (g, i, j)), one,
                 *([one] * n_stats)),
      compiler_params=params,
      interpret=interpret,
      name="fp8jax_quantize_blocks",
  )(w)
  return out[0], out[1], (dict(zip(STATS, out[2:])) if stats else None)


__all__ = ["FORMATS", "STATS", "block_of", "quantize_blocks", "rounds_exactly", "supports"]
