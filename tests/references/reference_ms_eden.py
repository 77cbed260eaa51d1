"""An independent NumPy reference of MS-EDEN (Quartet II, arXiv 2601.22813), written from
Quartet II's Triton kernel ``eden_1x16s_fp4_kernel`` (IST-DASLab/Quartet-II commit 8776a90)
with the conventions fp8jax states (docs/formats.md): every division of the kernel as
Triton compiles it (PTX ``div.full.f32``: the dividend times a reciprocal of the divisor),
modelled as ``a * float32(1 / b)``; scale-level subnormals taken as 0; elements rounded to
nearest even, the group sums element after element per 16-element block and then a tree
over the eight blocks.

Explicit loops over the groups and blocks of one row at a time, float32 scalars
(``np.float32`` arithmetic rounds every operation), E4M3 and E2M1 through ml_dtypes casts,
and the scale's stochastic rounding from E4M3 bit patterns (the neighbours ``bits - 1``,
``bits``, ``bits + 1`` of the nearest E4M3 value, as the Triton kernel finds them).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
VAL_MAX = F32(6.0 / ((17.0 / 16.0) * 0.93))
SCALES_MAX = F32(255.99)
GROUP, BLOCK = 128, 16


TINY = F32(np.finfo(F32).tiny)
FLT_MAX = F32(np.finfo(F32).max)


def flush(v) -> np.float32:
  """float32 ``v`` >= 0, a subnormal taken as 0 (fp8jax's convention for the scale level)."""
  return F32(0.0) if F32(v) < TINY else F32(v)


def over(a, b) -> np.float32:
  """Triton's float32 ``a / b`` for ``a, b >= 0``: ``a`` times the float32 reciprocal of
  ``b``, the reciprocal and the product flushed below 2**-126."""
  with np.errstate(over="ignore", divide="ignore"):
    return flush(F32(a) * flush(F32(F32(1.0) / F32(b))))


def e4m3(v) -> np.float32:
  """Nearest-even E4M3 value of float32 ``v`` (saturating at 448)."""
  return F32(np.float32(min(v, F32(448.0))).astype(ml_dtypes.float8_e4m3fn).astype(F32))


def e2m1(v) -> np.float32:
  """Nearest-even E2M1 value of float32 ``v`` (saturating at ±6), the sign kept."""
  c = np.clip(np.float32(v), F32(-6.0), F32(6.0))
  return F32(np.float32(c).astype(ml_dtypes.float4_e2m1fn).astype(F32))


def _neighbours(c: np.float32) -> tuple[np.float32, np.float32]:
  """The E4M3 values ``down <= c < up`` (``down == c`` on the grid) from bit patterns."""
  near = np.array(min(c, F32(448.0)), F32).astype(ml_dtypes.float8_e4m3fn)
  b = int(near.view(np.uint8))
  val = lambda k: F32(np.array(k, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32))  # noqa: E731
  cur = val(b)
  if cur > c:
    return val(b - 1), cur
  return cur, (val(b + 1) if b < 0x7E else cur)


def stochastic_e4m3(c: np.float32, word: int) -> np.float32:
  """``c`` (> 0) rounded up with probability ``(c - down) / (up - down)``: the top 24 bits
  of the uint32 ``word`` as ``u`` in [0, 1), up when ``u < f`` (exact in float64)."""
  if c >= 448:
    return F32(448.0)
  down, up = _neighbours(c)
  if up == down:
    return down
  f = (float(c) - float(down)) / (float(up) - float(down))
  u = (word >> 8) * 2.0**-24
  return up if u < f else down


def ms_eden_row_major(x: np.ndarray, words: np.ndarray):
  """MS-EDEN of ``x`` [R, C] (C a multiple of 128, finite) along its rows.

  Args:
    x: float32 [R, C].
    words: uint32 [R, C // 16], one random word per block.

  Returns:
    ``(q, scale_inv, d)``: E2M1 payload values [R, C], E4M3 block scales [R, C // 16]
    (float32), the tensor level ``d``.
  """
  x = np.asarray(x, F32)
  rows, cols = x.shape
  g = F32(np.max(np.abs(x))) if x.size else F32(0)
  d = F32(1.0) if g == 0 else over(over(g, SCALES_MAX), VAL_MAX)
  d = F32(min(max(d, F32(2.0**-126)), F32(2.0**126)))
  q = np.zeros_like(x)
  out = np.zeros((rows, cols // BLOCK), F32)
  for r in range(rows):
    for g0 in range(0, cols, GROUP):
      sds, block_sums_vv, block_sums_vq = [], [], []
      for b0 in range(g0, g0 + GROUP, BLOCK):
        amax = F32(np.max(np.abs(x[r, b0:b0 + BLOCK])))
        sd = e4m3(over(over(amax, VAL_MAX), d))
        if sd == 0:
          sd = F32(1.0)
        with np.errstate(over="ignore", divide="ignore"):
          s = F32(min(F32(F32(1.0) / flush(F32(sd * d))), FLT_MAX))
        vv, vq = F32(0.0), F32(0.0)
        for i in range(b0, b0 + BLOCK):
          v = F32(x[r, i] * s)
          q[r, i] = e2m1(v)
          vv = F32(vv + F32(v * v))
          vq = F32(vq + F32(v * q[r, i]))
        sds.append(sd)
        block_sums_vv.append(vv)
        block_sums_vq.append(vq)
      num, den = _tree(block_sums_vv), _tree(block_sums_vq)
      corr = F32(1.0) if den == 0 else over(num, den)
      for k, sd in enumerate(sds):
        j = g0 // BLOCK + k
        out[r, j] = stochastic_e4m3(F32(sd * corr), int(words[r, j]))
  return q, out, d


def _tree(values: list) -> np.float32:
  """Pairwise sum of 2**k float32 values: first half plus second half, again."""
  v = list(values)
  while len(v) > 1:
    h = len(v) // 2
    v = [F32(a + b) for a, b in zip(v[:h], v[h:])]
  return v[0]


def hadamard(n: int) -> np.ndarray:
  """The Sylvester Hadamard matrix of order ``n`` over sqrt(n), float64."""
  h = np.array([[1.0]])
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h / np.sqrt(n)
