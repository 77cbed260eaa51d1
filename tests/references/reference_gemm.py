"""Independent loop reference for the tensor-core accumulation model.

Python floats (float64) hold the FP8 products exactly; the alignment uses math.frexp and
math.trunc; promotion emulates float32 rounding with NumPy float32 scalars.
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32


def ref_aligned_sum(terms, fraction_bits):
  nonzero = [t for t in terms if t != 0.0]
  if not nonzero:
    return 0.0
  e_max = max(math.frexp(abs(t))[1] - 1 for t in nonzero)
  ulp = 2.0 ** (e_max - fraction_bits)
  return sum(math.trunc(t / ulp) for t in terms) * ulp


def ref_tensor_core_matmul(a, bt, sa, sb, ka, kb, *, fraction_bits=13, block_size=32,
                           interval=128):
  """a [M, K], bt [N, K]: FP8 payload values; sa [M, nKa], sb [N, nKb]: per-row
  scale_inv per K block of ka / kb elements. interval=None: never promote."""
  m_rows, k = a.shape
  n_rows = bt.shape[0]
  if interval is None:
    interval = -(-k // block_size) * block_size
  out = np.zeros((m_rows, n_rows), np.float32)
  for m in range(m_rows):
    for n in range(n_rows):
      acc32 = F32(0.0)
      for start in range(0, k, interval):
        acc = 0.0
        for t in range(start, start + interval, block_size):
          prods = [float(a[m, i]) * float(bt[n, i]) for i in range(t, min(t + block_size, k))]
          acc = ref_aligned_sum([acc] + prods, fraction_bits)
        scale = F32(F32(sa[m, start // ka]) * F32(sb[n, start // kb]))
        acc32 = F32(acc32 + F32(F32(acc) * scale))
      out[m, n] = acc32
  return out
