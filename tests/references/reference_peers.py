"""The anchors' own conventions, written from their published definitions, for the
conformance tests (``tests/numerics/test_conformance.py``, ``docs/formats.md``, "Conformance").

* :func:`ocp_mx`: the OCP MX v1.0 conversion (section 6.3: shared exponent
  ``floor(log2 amax) - emax_elem``, elements clamped to the element maximum) with the
  conventions of the specification's reference library (microsoft/microxcaling,
  ``mx/mx_ops.py``): the exponent is clamped below at -127 (E8M0's smallest value,
  section 5.4), a block maximum that is NaN or inf gives a NaN scale (the whole block
  NaN), an all-zero block takes ``log2(2**-126)`` (so the bottom exponent) and stays zero;
  elements are rounded half to even ("even") or half away from zero ("nearest", the
  library's default).
* :func:`torchao_nvfp4_block_scales`: torchao's two-level NVFP4 block scales
  (``torchao/prototype/mx_formats/nvfp4_tensor.py``): per-tensor scale ``amax / (448 * 6)``,
  block scale ``(amax_b / 6) / per_tensor_scale`` clamped to [2**-6, 448] (2**-6 is
  ``torch.finfo(float8_e4m3fn).tiny``), rounded to E4M3.

Everything is float64 with an unbounded exponent (no float32 flush) and explicit loops;
element grids are built from the OCP tables' parameters, not taken from fp8jax.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

# OCP MX v1.0 section 5.3: (exponent bits, mantissa bits, bias, max normal).
ELEMENTS = {
    "e4m3": (4, 3, 7, 448.0),
    "e5m2": (5, 2, 15, 57344.0),
    "e2m3": (2, 3, 1, 7.5),
    "e3m2": (3, 2, 3, 28.0),
    "e2m1": (2, 1, 1, 6.0),
}


def grid(name: str) -> list[float]:
  """The non-negative finite values of an element format, ascending (their index is the
  code, so an even index is an even mantissa)."""
  ebits, mbits, bias, top = ELEMENTS[name]
  out = [k * 2.0 ** (1 - bias - mbits) for k in range(2**mbits)]  # zero and subnormals
  for e in range(1, 2**ebits):
    out += [(1 + k / 2**mbits) * 2.0 ** (e - bias) for k in range(2**mbits)]
  return [v for v in out if v <= top]


def round_element(v: float, name: str, ties: str = "even") -> float:
  """``v`` rounded to the element grid, clamped to ±max; ``ties`` "even" or "nearest"
  (half away from zero). NaN stays NaN."""
  if math.isnan(v):
    return v
  values = grid(name)
  a = abs(v)
  if a >= values[-1]:
    return math.copysign(values[-1], v)
  i = max(k for k, g in enumerate(values) if g <= a)
  lo, hi = values[i], values[i + 1]
  if a - lo < hi - a:
    r = lo
  elif a - lo > hi - a:
    r = hi
  elif ties == "nearest":
    r = hi
  else:
    r = lo if i % 2 == 0 else hi
  return math.copysign(r, v)


def emax(name: str) -> int:
  """The exponent of the element format's largest normal value."""
  return math.floor(math.log2(ELEMENTS[name][3]))


def ocp_mx(block, name: str, *, ties: str = "even", bottom: int = -127, rule: str = "ocp"):
  """One block through the OCP MX conversion: ``(X, payload, dequantized)``.

  Args:
    block: the block's values (floats).
    name: element format.
    ties: element rounding, "even" or "nearest" (see the module docstring).
    bottom: the smallest shared exponent (-127 for E8M0; fp8jax clamps at -126).
    rule: "ocp" (section 6.3) or "rceil", the round-up variant of the MXFP8 recipe
      (arXiv 2506.08027): the smallest power of two >= amax / max, exactly.

  Returns:
    ``X`` (float, NaN for a NaN scale), the element values and ``payload * X`` (floats).
  """
  vals = [float(v) for v in block]
  if not all(math.isfinite(v) for v in vals):
    return math.nan, [math.nan] * len(vals), [math.nan] * len(vals)
  amax = max(abs(v) for v in vals)
  amax = amax if amax > 0 else 2.0**-126  # the library's FP32_MIN_NORMAL for zeros
  if rule == "ocp":
    shared = math.frexp(amax)[1] - 1 - emax(name)  # floor(log2 amax), exactly
  else:
    shared = math.ceil(math.log2(amax / ELEMENTS[name][3]))
  shared = max(shared, bottom)
  if shared > 127:
    return math.nan, [math.nan] * len(vals), [math.nan] * len(vals)
  x = 2.0**shared
  payload = [round_element(v / x, name, ties) for v in vals]
  return x, payload, [p * x for p in payload]


def torchao_nvfp4_block_scales(x) -> np.ndarray:
  """torchao's E4M3 block scales (as float64) of a 1-D tensor in blocks of 16."""
  x = np.asarray(x, np.float32)
  per_tensor = np.float32(np.max(np.abs(x))) / np.float32(448.0 * 6.0)
  out = []
  for i in range(0, x.size, 16):
    block_scale = np.float32(np.max(np.abs(x[i:i + 16]))) / np.float32(6.0)
    with np.errstate(invalid="ignore", divide="ignore"):
      scaled = np.float32(block_scale / per_tensor)
    scaled = np.clip(scaled, np.float32(2.0**-6), np.float32(448.0))
    out.append(float(scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)))
  return np.array(out)
