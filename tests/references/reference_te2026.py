"""NumPy float64 references for UE5M3 block scales and row-scaled NVFP4, written from their
definitions (Transformer Engine PR #3325 and CUDA 13.4's ``__nv_fp8_ue5m3``; TE's
``reference_nvfp4.py`` with ``row_scaled_nvfp4``), not from fp8jax's code.

UE5M3 is taken from its code table: each of the 256 codes decoded by the bit layout
(no sign, exponent bias 15, 3 mantissa bits, exponent 0 subnormal, 0xFF NaN); a value
rounds to the nearest entry of that table, a tie to the even code, past the largest
(114688) to it. Two-level NVFP4 is one block and one row at a time, each float32
operation as a float64 one rounded once to float32 (``reference_mx.f32``, subnormals
flushed as on XLA:CPU).
"""

from __future__ import annotations

import math

import numpy as np

from tests.references import reference_mx as rm

UE5M3_CODES = np.arange(255)
"""The finite codes, 0x00-0xFE."""


def ue5m3_value(code: int) -> float:
  """The float64 value of a UE5M3 code (NaN for 0xFF)."""
  if code == 0xFF:
    return math.nan
  e, m = code >> 3, code & 7
  return m / 8 * 2.0**-14 if e == 0 else (1 + m / 8) * 2.0 ** (e - 15)


UE5M3_TABLE = np.array([ue5m3_value(c) for c in UE5M3_CODES])


def ue5m3_round(v: float) -> tuple[float, int]:
  """(value, code) of |v| rounded to UE5M3: nearest, ties to the even code, saturating at
  the largest value (inf too); NaN -> (NaN, 0xFF)."""
  if math.isnan(v):
    return math.nan, 0xFF
  a = abs(v)
  if a >= UE5M3_TABLE[-1]:
    return float(UE5M3_TABLE[-1]), 0xFE
  hi = int(np.searchsorted(UE5M3_TABLE, a))  # first entry >= a
  lo = max(hi - 1, 0)
  dl, dh = a - UE5M3_TABLE[lo], UE5M3_TABLE[hi] - a
  code = lo if dl < dh or (dl == dh and lo % 2 == 0) else hi
  return float(UE5M3_TABLE[code]), code


def _round_scale(v: float, scale_format: str) -> float:
  if scale_format == "ue5m3":
    return ue5m3_round(v)[0]
  return rm.round_nearest(v, rm.E4M3)


def two_level(x: np.ndarray, tile: int = 16, scale_format: str = "e4m3",
              row_scaled: bool = False, elem: str = "e2m1"):
  """NVFP4 of ``x`` [R, C] (float32) in 1 x ``tile`` blocks along its last axis, with
  E4M3 or UE5M3 block scales and the FP32 level per tensor or per row (``row_scaled``).

  Returns ``(payload, scale_inv, level, deq)``: float64 payload values [R, C], block scales
  [R, ceil(C / tile)] (NaN for a block holding NaN or inf), the second level (a float, or
  [R] per row) and the dequantized values [R, C] (float32 steps).
  """
  fmt = rm.fmt_of(elem)
  top = 114688.0 if scale_format == "ue5m3" else 448.0
  xf = np.array([rm.f32(float(e)) for e in np.asarray(x, np.float32).ravel()]).reshape(
      x.shape)
  r, c = xf.shape
  nb = math.ceil(c / tile)
  pay, deq = np.zeros((r, c)), np.zeros((r, c))
  scale_inv, levels = np.zeros((r, nb)), np.zeros(r)

  def finite_block_amax(row):
    return [rm.finite_amax(xf[row, b * tile:(b + 1) * tile]) if np.all(np.isfinite(
        xf[row, b * tile:(b + 1) * tile])) else None for b in range(nb)]

  tensor_g = max((a for i in range(r) for a in finite_block_amax(i) if a is not None),
                 default=0.0)
  for i in range(r):
    g = max((a for a in finite_block_amax(i) if a is not None), default=0.0) if row_scaled \
        else tensor_g
    s_enc = 1.0 if g == 0 else min(max(rm.f32(top * fmt.max / g), 2.0**-126), 2.0**126)
    d = rm.f32(1.0 / s_enc)
    levels[i] = d
    mult = rm.f32(s_enc * rm.f32(1.0 / fmt.max))
    for b in range(nb):
      sl = slice(b * tile, min((b + 1) * tile, c))
      block = xf[i, sl]
      sd = _round_scale(min(rm.f32(rm.finite_amax(block) * mult), top), scale_format)
      prod = rm.f32(sd * d)
      enc = rm.FLT_MAX if prod == 0 else min(rm.f32(1.0 / prod), rm.FLT_MAX)
      if not np.all(np.isfinite(block)):
        enc, sd = 1.0, math.nan
      q = np.array([rm.round_nearest(rm.f32(e * enc), fmt) for e in block])
      q[np.isnan(block)] = 0.0
      pay[i, sl] = q
      deq[i, sl] = [rm.f32(rm.f32(p * sd) * d) for p in q]
      scale_inv[i, b] = sd
  return pay, scale_inv, levels if row_scaled else float(levels[0]) if r else 1.0, deq
