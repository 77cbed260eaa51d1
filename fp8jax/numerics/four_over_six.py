"""Four Over Six (4/6): NVFP4 block scales that map each block's largest magnitude to 4 or
to 6, whichever quantizes the block with less error (arXiv 2512.02010).

E2M1's grid is {0, 0.5, 1, 1.5, 2, 3, 4, 6}: between 4 and 6 it has no value, so a block
whose values sit near 5/6 of its maximum rounds them by up to 1. Scaling the block so that
its maximum lands on 4 instead uses the finer part of the grid for it. Each block tries
both and keeps the one whose dequantized values are closer to the input.

The rule as Transformer Engine's reference quantizer computes it
(``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py``, lines 523-648, and
``common/cast/nvfp4/quantize_4over6_nvfp4.cuh``, at commit
d0067d0da6cb01811b8072a7d304f0e00344ce2b; the paper's code, mit-han-lab/fouroversix,
agrees), every operation in float32, ``E`` = 256 (TE's default for 4/6, "to leave room
for map-to-4 scale expansion": the largest block's 4-scale, 1.5 x 256 = 384, stays under
E4M3's 448) or 448, ``G`` the tensor's largest finite magnitude::

    S_enc  = 6 E / G,  D = 1 / S_enc                  # as fp8jax.numerics.scales
    base_b = (amax_b / 6) * S_enc                      # divide first, then multiply
    sd6_b  = e4m3(min(base_b, 448)),  sd4_b = e4m3(min(1.5 * base_b, 448))
    s_k    = min(1 / (sd_k * D), FLT_MAX)              # each candidate's multiplier
    q_k    = e2m1(x * s_k)                              # nearest even, saturating at 6
    err_k  = sum over the block of |((q_k * sd_k) * G) / (6 E) - x|    ("mae", TE's default)
             or of its square                                          ("mse")
    4 if err4 < err6 else 6                            # ties, and NaN, keep 6

The sums run in the block's element order, one addition after another, as the reference
loops; for a 2-D block (16 x 16 weights) each row is summed so and the rows are added as
a tree (rows 0-7 + 8-15, then 0-3 + 4-7, 0-1 + 2-3, 0 + 1), as TE's reference does. TE
applies 4/6 to weights and activations, never to gradients, and not with the RHT or
stochastic rounding (``QuantSpec`` refuses stochastic rounding with it). With
``row_scaled``, ``G`` is each row's, in the scales and in the errors, as TE's reference
takes it. TE's reference itself, run on recorded inputs, gives the same payloads and
scales bit for bit (tests/references/test_te_nvfp4_bits.py; docs/formats.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp8jax.numerics import blocks, formats
from fp8jax.numerics import scales as scales_lib

_E4M3_MAX = 448.0
_FLT_MAX = float(jnp.finfo(jnp.float32).max)


def _sequential_sum(v: jax.Array, axis: int) -> jax.Array:
  """Sum over ``axis`` (kept, size 1) adding one element after another."""
  total = jax.lax.index_in_dim(v, 0, axis)
  for i in range(1, v.shape[axis]):
    total = total + jax.lax.index_in_dim(v, i, axis)
  return total


def _tree_sum(v: jax.Array, axis: int) -> jax.Array:
  """Sum over ``axis`` (a power of two; kept, size 1): first half plus second half, again."""
  while v.shape[axis] > 1:
    half = v.shape[axis] // 2
    if v.shape[axis] % 2:
      raise ValueError(f"Four Over Six sums the rows of a 2-D block as a tree: its "
                       f"{v.shape[axis]} rows must be a power of two")
    v = (jax.lax.slice_in_dim(v, 0, half, axis=axis)
         + jax.lax.slice_in_dim(v, half, 2 * half, axis=axis))
  return v


def block_error(diff: jax.Array, inner: tuple[int, ...]) -> jax.Array:
  """Per-block sums of ``diff`` (blocked layout ``[n0, b0, n1, b1, ...]``, ``inner`` the
  block axes): sequential along the last block axis of size > 1, then a tree over the one
  before it (2-D blocks); axes of size 1 are summed trivially."""
  wide = [a for a in inner if diff.shape[a] > 1]
  if len(wide) > 2:
    raise ValueError(f"Four Over Six takes 1-D or 2-D blocks, got {len(wide)} dimensions")
  out = diff
  if wide:
    out = _sequential_sum(out, wide[-1])
  if len(wide) == 2:
    out = _tree_sum(out, wide[0])
  return out


def candidates(amax: jax.Array, s_enc: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The E4M3 block scales (float32) that map a finite block maximum ``amax`` to 6 and to
  4 under the per-tensor ``s_enc``: ``e4m3(min(f * (amax / 6) * s_enc, 448))``, f = 1 and
  1.5, the division first as TE's reference computes it."""
  base = (amax.astype(jnp.float32) / jnp.float32(6.0)) * s_enc
  e4m3 = formats.get_format("e4m3")
  return tuple(formats.round_to_format(jnp.minimum(base * jnp.float32(f), _E4M3_MAX), e4m3)
               for f in (1.0, 1.5))


def choose_scales(xs: jax.Array, amax: jax.Array, spec, inner: tuple[int, ...]):
  """The 4/6 scales of blocked ``xs`` (float, layout ``[n0, b0, n1, b1, ...]``, the block
  axes ``inner``) with per-block ``amax`` (keepdims, +inf for a block holding NaN or inf).

  Returns ``(s, scale_inv, tensor_scale_inv, chose_four)`` as
  ``scales.compute_scales`` does (float32, shaped like ``amax``; ``tensor_scale_inv`` per
  row for a row-scaled spec, whose ``G`` is then each row's, also in the error, as TE's
  reference takes it), and a bool per block: True where the maximum was mapped to 4."""
  raw = amax.astype(jnp.float32)
  finite = jnp.where(jnp.isfinite(raw), raw, 0.0)
  e = float(spec.four_over_six_max)
  g = jnp.maximum(scales_lib.level_amax(raw, spec, blocked=True), jnp.float32(spec.eps))
  s_enc = jnp.clip(jnp.float32(6.0 * e) / g, 2.0**-126, 2.0**126)
  s_enc = jnp.where(g > 0, s_enc, jnp.float32(1.0))
  d = 1.0 / s_enc
  e2m1 = formats.get_format("e2m1")
  x = xs.astype(jnp.float32)
  # A true division, as TE's reference divides: XLA rewrites a division by a constant
  # into a multiply by its rounded reciprocal, which moves near-ties between 4 and 6.
  six_e = jax.lax.optimization_barrier(jnp.float32(6.0 * e))
  cands = []
  for sd in candidates(finite, s_enc):
    s = jnp.minimum(1.0 / (sd * d), jnp.float32(_FLT_MAX))
    q = formats.round_to_format(x * s, e2m1)
    diff = ((q * sd) * g) / six_e - x
    diff = jnp.abs(diff) if spec.four_over_six == "mae" else diff * diff
    cands.append((s, sd, block_error(diff, inner)))
  (s6, sd6, err6), (s4, sd4, err4) = cands
  four = err4 < err6
  s = jnp.where(four, s4, s6)
  scale_inv = jnp.where(four, sd4, sd6)
  s, scale_inv = scales_lib.mark_nonfinite(s, scale_inv, raw)
  return s, scale_inv, d, four & jnp.isfinite(raw)


def scales_of(x: jax.Array, block: tuple[int, ...], spec):
  """:func:`choose_scales` for unblocked ``x``: ``(s, scale_inv, tensor_scale_inv,
  chose_four)``, the per-block arrays shaped ``blocks.num_blocks(x.shape, block)`` (a
  row-scaled ``tensor_scale_inv`` too, with the tile's axis 1)."""
  xs, inner, _ = blocks.split_blocks(x, block)
  amax = jnp.max(blocks.amax_abs(xs), axis=inner, keepdims=True, initial=0.0)
  s, scale_inv, d, four = choose_scales(xs, amax, spec, inner)
  squeeze = lambda v: jnp.squeeze(v, inner)  # noqa: E731
  return squeeze(s), squeeze(scale_inv), squeeze(d) if d.ndim else d, squeeze(four)


__all__ = ["block_error", "candidates", "choose_scales", "scales_of"]
