"""NumPy counts of the scale rules' per-block choices, written from the rules' papers and
google/qwix (commit 901efed), not from fp8jax: the blocks OAS (arXiv 2603.08713) scales a
binade above the OCP MX v1.0 rule. Four Over Six's choice per block is
``tests/numerics/test_four_over_six.py``'s reference (Transformer Engine's loops)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

F32 = np.float32
QMAX = {"e2m1": 6.0, "e4m3": 448.0}
EMAX = {"e2m1": 2, "e4m3": 8}
OAS_C = {"e2m1": 12.0 / 7.0, "e4m3": 60.0 / 31.0}


def live_blocks(x: np.ndarray, tile: int) -> np.ndarray:
  """bool [R, C / tile]: the 1 x ``tile`` blocks of ``x`` [R, C] with a nonzero maximum and
  no NaN or inf (the blocks a scale rule decides)."""
  b = np.asarray(x, np.float64).reshape(x.shape[0], -1, tile)
  return np.all(np.isfinite(b), axis=-1) & np.any(b != 0, axis=-1)


def oas_raised(x: np.ndarray, fmt: str, tile: int = 32) -> np.ndarray:
  """bool [R, C / tile]: live blocks whose OAS scale ``2^floor(log2(bf16(amax / max *
  C)))`` (float32 steps) exceeds the OCP scale ``2^(floor(log2 amax) - emax)``."""
  out = np.zeros((x.shape[0], x.shape[1] // tile), bool)
  live = live_blocks(x, tile)
  for r, b in zip(*np.nonzero(live)):
    amax = F32(np.max(np.abs(x[r, b * tile:(b + 1) * tile])))
    t = F32(F32(amax / F32(QMAX[fmt])) * F32(OAS_C[fmt]))
    oas = math.floor(math.log2(float(ml_dtypes.bfloat16(t))))
    out[r, b] = oas > math.floor(math.log2(float(amax))) - EMAX[fmt]
  return out
