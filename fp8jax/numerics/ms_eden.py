"""MS-EDEN: unbiased NVFP4 rounding through the block scales (Quartet II, arXiv 2601.22813).

Stochastic rounding of the elements makes a quantizer unbiased at the price of its error.
MS-EDEN rounds the elements to nearest and puts the randomness into the E4M3 block scales:
over a group of :data:`~fp8jax.numerics.spec.MS_EDEN_GROUP` (128) elements that a random
Hadamard rotation has mixed, the EDEN correction ``S = <v, v> / <v, q>`` (``v`` the scaled
group, ``q`` its rounding) is the factor that makes ``S q`` an unbiased estimate of ``v``
over the rotation's randomness; each block's scale is multiplied by its group's ``S`` and
the product rounded stochastically to E4M3, so that the scale too is right in expectation.

As Quartet II's training code computes it (IST-DASLab/Quartet-II commit 8776a90,
``src/models/quantization/quantizers/nvfp4_triton.py`` ``eden_1x16s_fp4_kernel`` and
``schemes/quartet_2.py``), every operation in float32, ``m = 6 / ((17 / 16) * 0.93)``
(:data:`VAL_MAX`: the block maximum lands a little above 6 and saturates, which the
correction pays back), ``G`` the tensor's largest finite magnitude. Triton compiles a
float32 ``a / b`` to PTX ``div.full.f32``, which multiplies ``a`` by a reciprocal of ``b``
and is not rounded correctly; each of the kernel's divisions is therefore taken here as
``a * (1 / b)``, the reciprocal rounded to float32 (:func:`_rcp_mul`). Its output on an
H200 (``scripts/gpu/reference_bits_ms_eden.py``) has this tensor level on all six recorded
inputs, where ``(G / 255.99) / m`` is one ulp off on five::

    D     = (G * (1 / 255.99)) * (1 / m)     (1 when G = 0)       tensor_scale_inv
    sd_b  = e4m3((amax_b * (1 / m)) * (1 / D))  (1 where it rounds to 0)
    v     = x * (1 / (sd_b * D))
    q     = e2m1(v)                         nearest even, saturating at 6
    S_g   = <v, v> * (1 / <v, q>) over the group  (1 where <v, q> = 0)
    c_b   = sd_b * S_g
    scale_inv_b = e4m3 stochastic rounding of c_b: up with probability
                  (c_b - down) / (up - down), from 24 random bits per block
    x_hat = (q * scale_inv_b) * D

The E4M3 maximum of the tensor level is 255.99 (not 448), so that a corrected scale stays
below 448. The group sums run element after element within each 16-element block, then
the eight block sums are added as a tree (0-3 + 4-7, 0-1 + 2-3, 0 + 1), the order the NumPy
reference (``tests/references/reference_ms_eden.py``) follows; the Triton kernel's
``tl.sum`` follows its thread layout. Differences by convention (docs/formats.md,
"Conformance"): Triton rounds E2M1 ties away from zero and gives ``-0`` for an element
``+0`` (its sign is ``x > 0 ? 1 : -1``); fp8jax rounds ties to even (as the CUDA kernel's
``cvt.rn``) and keeps the sign of zero. ``D`` is clipped to [2**-126, 2**126] as fp8jax's
NVFP4 tensor scale, and a scale-level product or reciprocal below 2**-126 (a float32
subnormal) is taken as 0 (:func:`_ftz`): XLA:CPU flushes such values and XLA:GPU does not,
so the flush is explicit and both give the same bits. It matters only for tensors whose
largest magnitude is below about 2e-35, where ``D`` is clipped. A block holding NaN or inf
gets a NaN scale (the whole block NaN), and its elements stay out of its group's sums, so
the other blocks of the group keep a finite correction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fp8jax.numerics import blocks, formats
from fp8jax.numerics import scales as scales_lib
from fp8jax.numerics.spec import MS_EDEN_GROUP

SCALE_OVERRIDE = (17.0 / 16.0) * 0.93
"""Quartet II's ``backward_scale_override`` (Python float64, as its code computes it)."""
VAL_MAX = np.float32(6.0 / SCALE_OVERRIDE)
"""The value a block's maximum maps to: ``float32(6 / SCALE_OVERRIDE)`` = 6.0721..."""
SCALES_MAX = np.float32(255.99)
"""The largest block scale the tensor level allows (E4M3 headroom for the correction)."""
_FLT_MAX = float(np.finfo(np.float32).max)
_FLT_TINY = np.float32(np.finfo(np.float32).tiny)
_BLOCK = 16


def _ftz(v: jax.Array) -> jax.Array:
  """``v`` (float32, >= 0) with its subnormal values taken as 0, on every backend."""
  return jnp.where(v < _FLT_TINY, jnp.float32(0.0), v)


def _rcp_mul(a: jax.Array, b) -> jax.Array:
  """``a * (1 / b)`` for ``a, b >= 0``, each operation rounded to float32 (the model of
  Triton's ``/``, PTX ``div.full.f32``) and its subnormal results taken as 0. The operands
  pass a barrier, so that XLA neither merges the product into a division nor reassociates
  two of them (``(a * r1) * r2`` into ``a * (r1 * r2)``)."""
  a = jnp.asarray(a, jnp.float32)
  b = jnp.asarray(b, jnp.float32)
  r = _ftz(jnp.float32(1.0) / b)
  a, r = jax.lax.optimization_barrier((a, r))
  return _ftz(a * r)


def _block_tree_sum(v: jax.Array) -> jax.Array:
  """[..., groups, 8, 16] -> [..., groups]: each block summed element after element, then
  the eight block sums added as a tree."""
  total = v[..., 0]
  for i in range(1, v.shape[-1]):
    total = total + v[..., i]
  while total.shape[-1] > 1:
    half = total.shape[-1] // 2
    total = total[..., :half] + total[..., half:]
  return total[..., 0]


def quantize_blocks(x: jax.Array, bits: jax.Array):
  """MS-EDEN quantization of ``x`` along its last axis in 1 x 16 blocks.

  Args:
    x: float array [..., C] (C zero-padded to whole groups inside; padding enters no sum
      and no amax).
    bits: uint32 random bits, one per block: shape ``[..., ceil(C / 16)]``.

  Returns:
    ``(q, s, scale_inv, tensor_scale_inv, scaled)``: the payload values [..., C] (float32
    E2M1 values, 0 in a non-finite block), the per-block multiplier and stochastically
    rounded E4M3 scale (float32, [..., ceil(C / 16)]; NaN for a non-finite block), ``D``
    (float32 scalar) and ``x * s`` [..., C].
  """
  e4m3, e2m1 = formats.get_format("e4m3"), formats.get_format("e2m1")
  shape = tuple(x.shape)
  c = shape[-1]
  nb = -(-c // _BLOCK)
  c_pad = -(-c // MS_EDEN_GROUP) * MS_EDEN_GROUP
  xf = jnp.pad(x.astype(jnp.float32), [(0, 0)] * (len(shape) - 1) + [(0, c_pad - c)])
  xb = xf.reshape(*shape[:-1], c_pad // _BLOCK, _BLOCK)
  raw = jnp.max(blocks.amax_abs(xb), axis=-1)  # +inf marks a non-finite block
  finite = jnp.isfinite(raw)
  amax = jnp.where(finite, raw, 0.0)
  g = jnp.max(amax, initial=0.0)
  d = jnp.clip(_rcp_mul(_rcp_mul(g, SCALES_MAX), VAL_MAX), 2.0**-126, 2.0**126)
  d = jnp.where(g > 0, d, jnp.float32(1.0))
  sd = formats.round_to_format(_rcp_mul(_rcp_mul(amax, VAL_MAX), d), e4m3)
  sd = jnp.where(sd == 0, jnp.float32(1.0), sd)
  s = jnp.minimum(1.0 / _ftz(sd * d), jnp.float32(_FLT_MAX))
  s = jnp.where(finite, s, jnp.float32(1.0))
  scaled = xb * s[..., None]
  q = formats.round_to_format(scaled, e2m1)
  keep = finite[..., None]
  vv = jnp.where(keep, scaled * scaled, 0.0)
  vq = jnp.where(keep, scaled * q, 0.0)
  grouped = (*shape[:-1], c_pad // MS_EDEN_GROUP, MS_EDEN_GROUP // _BLOCK, _BLOCK)
  num, den = (_block_tree_sum(v.reshape(grouped)) for v in (vv, vq))
  corr = jnp.where(den == 0, jnp.float32(1.0), _rcp_mul(num, jnp.where(den == 0, 1.0, den)))
  corrected = sd * jnp.repeat(corr, MS_EDEN_GROUP // _BLOCK, axis=-1)
  bits = jnp.pad(bits.astype(jnp.uint32), [(0, 0)] * (len(shape) - 1) + [(0, c_pad // _BLOCK
                                                                           - nb)])
  scale_inv = formats.stochastic_round_to_format(corrected, e4m3, bits, 24)
  s, scale_inv = scales_lib.mark_nonfinite(s, scale_inv, raw)
  q = jnp.where(keep, q, 0.0).reshape(*shape[:-1], c_pad)[..., :c]
  scaled = scaled.reshape(*shape[:-1], c_pad)[..., :c]
  return q, s[..., :nb], scale_inv[..., :nb], d, scaled


__all__ = ["SCALES_MAX", "SCALE_OVERRIDE", "VAL_MAX", "quantize_blocks"]
