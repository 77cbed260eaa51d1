"""Pallas (GPU Triton backend) kernel for the fused 1 x t fake-quant round trip.

One program per ``[block_rows, tiles_per_block * t]`` block of a ``[rows, K]`` view of
``x``: it loads the block, takes the amax of every 1 x t tile of the block (``block_rows``
rows times ``tiles_per_block`` tiles), computes the scales with
:func:`fp8jax.numerics.scales.compute_scale`, rounds to FP8 and stores ``x_hat`` in the dtype of
``x``: one read and one write of ``x``. The result equals
:func:`fp8jax.quant.fused_round_trip.quantize_dequantize_fused` bit for bit wherever the backend's
float32 division does (always with power-of-two scales).

Rounding (``rounding``):

* ``"integer"`` (default): :func:`fp8jax.numerics.scales.apply_scales`, i.e.
  :func:`fp8jax.numerics.formats.round_to_format` (~40 integer ops per element), any format.
* ``"cast"``: the hardware conversion, ``clip(x * s, -max, max).astype(fp8).astype(f32)``
  (:func:`fp8jax.numerics.formats.saturating_cast`, which ``round_to_format`` equals bit for bit),
  E4M3 and E5M2 only. The Pallas Triton lowering emits ``tt.fp_to_fp`` with rounding
  RTNE, which Triton lowers on sm_90+ to ``cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32``
  (round to nearest even; the way back, fp8 -> f16 -> f32, is exact). Below sm_90 Triton
  goes through f16 rounded toward zero first (double rounding, not RNE), so the kernel
  refuses ``"cast"`` on such a GPU; Pallas refuses the fnuz formats. The clip makes
  values that would round above ``max`` (E4M3: above 464, which XLA's cast turns into
  NaN; 448 * (1 + 2**-10) rounds to 448 either way) and +-inf saturate to +-max as in
  ``saturating_cast`` on any backend (the hardware ``satfinite`` would too). NaN:
  Triton's min/max drop NaN (``maxnumf``), so NaN is selected back from ``x * s`` at the
  end, giving exactly the value ``apply_scales`` gives.

Scale arithmetic: the divisions of :func:`fp8jax.numerics.scales.compute_scale` (``target / amax``,
``1 / s``) run once per tile on the reduced ``[.., 1]`` amax; per element there are only
the two multiplications by ``s`` and ``scale_inv`` that ``apply_scales`` also does, so
there is no per-element division to replace and both roundings keep the fused path's
arithmetic exactly.

Three ways to split the work into blocks (``split``): ``"loop"`` loads, rounds and stores
each ``[block_rows, t]`` sub-block in turn (a static loop, one load and one store per
tile); ``"reshape"`` loads the whole block once, reshapes it to
``[block_rows, tiles_per_block, t]`` for the per-tile amax and stores it once (with
``tiles_per_block=1`` the two are the same kernel); ``"flat"`` views ``x`` as
``[size / t, t]`` (one tile per row, a free reshape) and gives each program
``block_rows`` consecutive tiles: one contiguous ``block_rows * t``-element chunk of
memory, so the widest loads and no strided rows (``tiles_per_block`` is ignored).

Pallas is imported when the kernel is called, not when this module is imported. On
CPU, pass ``interpret=True``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from fp8jax.numerics import blocks, formats, scales
from fp8jax.numerics import spec as spec_lib


def tile_size(spec: spec_lib.QuantSpec) -> int | None:
  """The tile length ``t`` when ``spec`` is current-scaled 1 x t tiles along the last
  axis with ``t`` a power of two and round-to-nearest, else None (the kernel does not
  handle it)."""
  g = spec.granularity
  if spec.scaling != "current" or g.kind != "tile" or g.axes != (-1,):
    return None
  if spec.rounding != "nearest" or spec.four_over_six or spec.row_scaled or \
      spec.scale_format == "ue5m3":  # 4/6, row-scaled, UE5M3: the XLA route
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


def _view(x_shape: tuple[int, ...], t: int, split: str) -> tuple[int, int]:
  """The 2-D ``(rows, K)`` view of ``x`` that the kernel tiles."""
  size = math.prod(x_shape)
  return (size // t, t) if split == "flat" else (size // x_shape[-1], x_shape[-1])


def block_shape(x_shape: tuple[int, ...], spec: spec_lib.QuantSpec, block_rows: int = 32,
                tiles_per_block: int = 1, split: str = "loop") -> tuple[int, int]:
  """The ``(rows, tiles)`` per program that :func:`fake_quant_pallas` uses for an input
  of ``x_shape``: each rounded down to a power of two dividing the number of rows and
  the number of tiles per row of the 2-D view (``[prod(x_shape[:-1]), K]``, or
  ``[size / t, t]`` with one tile per row for ``split="flat"``)."""
  t = tile_size(spec)
  if t is None:
    raise ValueError(f"not a 1 x t tile spec: {spec.describe()}")
  rows, k = _view(tuple(x_shape), t, split)
  return _rows_per_block(rows, block_rows), _pow2_divisor(k // t, tiles_per_block)


ROUNDINGS = ("integer", "cast")
CAST_FORMATS = ("e4m3", "e5m2")  # FP8 formats that rounding="cast" rounds exactly


def apply_scales_cast(x: jax.Array, s: jax.Array, scale_inv: jax.Array,
                      fmt: formats.FloatFormat, dtype) -> jax.Array:
  """:func:`fp8jax.numerics.scales.apply_scales` with the rounding done by an FP8 cast.

  Equal to it bit for bit where ``astype(fmt.dtype)`` rounds to nearest even (XLA, and
  Triton on sm_90+): ``clip(v, -max, max)`` then the cast is
  :func:`fp8jax.numerics.formats.saturating_cast`, which ``round_to_format`` equals, and the rest
  is the same arithmetic. NaN in ``v = x * s`` or in ``scale_inv`` (a non-finite block)
  gives ``v * scale_inv``, NaN, as there (selected back at the end because Triton's clip
  turns NaN into -max); ±inf saturates to ±max.
  """
  dtype = jnp.dtype(dtype)
  v = x.astype(jnp.float32) * s
  q = jnp.clip(v, -fmt.max, fmt.max).astype(fmt.dtype).astype(jnp.float32)
  top = float(jnp.finfo(dtype).max)
  out = jnp.clip(q * scale_inv, -top, top)  # NaN only through scale_inv or v: see below
  nan = jnp.isnan(v) | jnp.isnan(scale_inv)
  return jnp.where(nan, v * scale_inv, out).astype(dtype)


_APPLY = {"integer": scales.apply_scales, "cast": apply_scales_cast}


def _round_tile(x, spec: spec_lib.QuantSpec, dtype, axis: int, rounding: str, g=None):
  """One tile's round trip; ``g`` [1, 1] is the tensor's amax (two-level scales)."""
  # +inf for a tile holding NaN or ±inf: its scale_inv is NaN (the whole tile NaN).
  amax = jnp.max(blocks.amax_abs(x), axis=axis, keepdims=True)
  # Per tile: [.., 1] along `axis`; the two-level rule reads the tensor amax from `g`.
  s, scale_inv, tensor_scale_inv = scales.compute_scales(amax, spec, g)
  if tensor_scale_inv is not None:
    return scales.apply_scales(x, s, scale_inv, spec.fmt, dtype, tensor_scale_inv)
  return _APPLY[rounding](x, s, scale_inv, spec.fmt, dtype)


def _refs(refs):
  """(x_ref, g_ref or None, o_ref) of a kernel called with or without the tensor amax."""
  return (refs[0], None, refs[1]) if len(refs) == 2 else refs


def _kernel_loop(*refs, spec: spec_lib.QuantSpec, t: int, tiles: int, rounding: str):
  x_ref, g_ref, o_ref = _refs(refs)
  g = None if g_ref is None else g_ref[...]
  if tiles == 1:
    o_ref[...] = _round_tile(x_ref[...], spec, o_ref.dtype, 1, rounding, g)  # [bm, t]
    return
  from jax.experimental import pallas as pl

  for j in range(tiles):  # static: one load and one store of [bm, t] per tile
    cols = pl.ds(j * t, t)
    o_ref[:, cols] = _round_tile(x_ref[:, cols], spec, o_ref.dtype, 1, rounding, g)


def _kernel_reshape(*refs, spec: spec_lib.QuantSpec, t: int, tiles: int, rounding: str):
  x_ref, g_ref, o_ref = _refs(refs)
  x = x_ref[...]  # [bm, tiles * t]
  bm = x.shape[0]
  g = None if g_ref is None else g_ref[...][:, :, None]
  y = _round_tile(x.reshape(bm, tiles, t), spec, o_ref.dtype, 2, rounding, g)
  o_ref[...] = y.reshape(bm, tiles * t)


# "flat" is the loop kernel with one tile per row, on the [size / t, t] view.
_KERNELS = {"loop": _kernel_loop, "reshape": _kernel_reshape, "flat": _kernel_loop}


def _check_cast(spec: spec_lib.QuantSpec, interpret: bool) -> None:
  """Raises ValueError where rounding="cast" would not equal the integer rounding."""
  if spec.fmt.name not in CAST_FORMATS:
    raise ValueError(
        f"rounding='cast' supports the formats {CAST_FORMATS} (the Pallas Triton lowering "
        f"has no exact cast to {spec.fmt.name}); use rounding='integer'")
  if interpret or jax.default_backend() != "gpu":
    return
  from fp8jax.kernels import placement

  cc = placement.compute_capability()  # None: not a CUDA device, the lowering decides
  if cc is not None and cc[0] < 9:
    raise ValueError(
        f"rounding='cast' needs compute capability >= 9.0 (Triton rounds f32 -> fp8 "
        f"through f16 below it, not to nearest even); this GPU has {cc[0]}.{cc[1]}")


# The fastest configuration measured on Hopper
# (docs/performance/archive/2026-11-21_second_pass_pallas.md, target 1).
AUTO = dict(block_rows=32, split="flat", rounding="cast", num_warps=4)


def auto_config(spec: spec_lib.QuantSpec) -> dict:
  """:data:`AUTO`, with integer rounding where the hardware cast does not apply (formats
  other than E4M3/E5M2, two-level scales)."""
  if spec.fmt.name in CAST_FORMATS and spec.scale_format != "e4m3":
    return AUTO
  return {**AUTO, "rounding": "integer"}


def auto_applies(x_shape: tuple[int, ...], dtype, spec: spec_lib.QuantSpec) -> bool:
  """Whether :func:`fp8jax.fake_quant` takes this kernel (with :data:`AUTO`) for an input
  of ``x_shape``: a Hopper or newer GPU outside a multi-device context mesh
  (:mod:`fp8jax.kernels.placement`), 1 x t tiles (:func:`supports`), an OCP format (FP8,
  FP6, FP4) with one-level scales and a 16- or 32-bit float input. Use it with
  :func:`auto_config`. Two-level (NVFP4) scales are left to the fused XLA path: the
  kernel, which needs the tensor amax first, was the slower of the two on Hopper
  (docs/performance/archive/2026-11-23_mx_nvfp4_fake_quant.md)."""
  from fp8jax.kernels import placement

  if spec.scale_format == "e4m3":
    return False
  if not (supports(tuple(x_shape), spec) and not spec.fmt.name.endswith("fnuz")
          and jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize >= 2):
    return False
  if not placement.kernels_allowed():
    return False
  return placement.capability_at_least(9)


def fake_quant_pallas(x: jax.Array, spec: spec_lib.QuantSpec, *, block_rows: int = 32,
                      tiles_per_block: int = 1, num_warps: int | None = None,
                      split: str = "loop", rounding: str = "integer",
                      interpret: bool = False) -> jax.Array:
  """Fake-quantizes ``x`` with 1 x t tiles along its last axis in one Pallas kernel.

  Args:
    x: float32, bfloat16 or float16 array ``[..., K]`` with ``K % t == 0``.
    spec: current scaling, ``tile(t, -1)`` granularity with ``t`` a power of two, any
      format and scale rule.
    block_rows: rows per program (rounded down to a power of two dividing the number
      of rows ``prod(x.shape[:-1])``; with ``split="flat"``, tiles per program, rounded
      down to a power of two dividing ``x.size / t``).
    tiles_per_block: 1 x t tiles per row of a program's block, i.e. ``tiles_per_block * t``
      columns per program (rounded down to a power of two dividing ``K / t``; ignored
      with ``split="flat"``).
    num_warps: Triton warps per program (None: the Pallas default).
    split: how the work is cut into blocks and tiles, ``"loop"``, ``"reshape"`` or
      ``"flat"`` (see the module docstring); the same result either way.
    rounding: ``"integer"`` (any format) or ``"cast"`` (E4M3/E5M2 on sm_90+; see the
      module docstring); the same result either way.
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
  if rounding not in ROUNDINGS:
    raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
  if rounding == "cast":
    _check_cast(spec, interpret)
  from jax.experimental import pallas as pl  # lazy: no import-time cost

  t = tile_size(spec)
  rows, k = _view(tuple(x.shape), t, split)
  bm, tiles = block_shape(tuple(x.shape), spec, block_rows, tiles_per_block, split)
  bn = tiles * t
  x2 = x.reshape(rows, k)
  compiler_params = None
  if num_warps is not None and not interpret:
    from jax.experimental.pallas import triton as pl_triton
    compiler_params = pl_triton.CompilerParams(num_warps=num_warps)
  spec_block = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
  in_specs, args = [spec_block], [x2]
  if spec.scale_format == "e4m3":  # two-level: the tensor amax first (one XLA reduction)
    in_specs.append(pl.BlockSpec((1, 1), lambda i, j: (0, 0)))
    tiles_amax = jnp.max(blocks.amax_abs(x2.reshape(rows, k // t, t)), axis=-1)
    g = jnp.max(jnp.where(jnp.isfinite(tiles_amax), tiles_amax, 0.0), initial=0.0)
    args.append(g.reshape(1, 1))  # over the tiles free of NaN and inf, as compute_scales
  out = pl.pallas_call(
      functools.partial(_KERNELS[split], spec=spec, t=t, tiles=tiles, rounding=rounding),
      out_shape=jax.ShapeDtypeStruct((rows, k), x.dtype),
      grid=(rows // bm, k // bn),
      in_specs=in_specs,
      out_specs=spec_block,
      compiler_params=compiler_params,
      interpret=interpret,
      name="fp8jax_fake_quant",
  )(*args)
  return out.reshape(x.shape)


__all__ = ["CAST_FORMATS", "ROUNDINGS", "apply_scales_cast", "auto_config", "block_shape",
           "fake_quant_pallas", "supports", "tile_size"]
