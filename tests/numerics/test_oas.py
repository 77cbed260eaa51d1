"""The OAS scale rule (``pow2_rounding="oas"``, fp8jax/numerics/scales.py) against a NumPy
and ml_dtypes computation written from google/qwix (commit 901efed,
``qarray.compute_scale_zero_point``): ``2**floor(log2(bfloat16(amax / max * C)))``."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from tests import strategies as hs

F32 = np.float32
QMAX = {"e2m1": 6.0, "e4m3": 448.0}
C = {"e2m1": 12.0 / 7.0, "e4m3": 60.0 / 31.0}
DTYPE = {"e2m1": ml_dtypes.float4_e2m1fn, "e4m3": ml_dtypes.float8_e4m3fn}


def ref_scale(amax: float, fmt: str) -> float:
  """qwix's float32 steps: amax / qmax, times C (float32), rounded to bfloat16, its
  exponent kept."""
  t = F32(F32(F32(amax) / F32(QMAX[fmt])) * F32(C[fmt]))
  return 2.0 ** math.floor(math.log2(float(ml_dtypes.bfloat16(t))))


def _spec(fmt):
  base = fp8jax.preset("mxfp4" if fmt == "e2m1" else "mxfp8").replace(backward=None)
  return base.replace(pow2_rounding="oas")


@pytest.mark.parametrize("fmt, amax, want", [
    ("e2m1", 6.5, 1.0), ("e2m1", 7.5, 2.0),       # qwix's own test
    ("e4m3", 460.0, 1.0), ("e4m3", 465.0, 2.0),   # qwix's own test
    ("e2m1", 6.99, 2.0), ("e4m3", 462.1, 2.0),     # the bfloat16 step rounds up to 2
    ("e2m1", 3.5, 1.0), ("e2m1", 3.49, 0.5), ("e4m3", 0.0, 1.0)])
def test_qwix_cases(fmt, amax, want):
  _, scale_inv = fp8jax.compute_scale(jnp.float32(amax), _spec(fmt))
  assert float(scale_inv) == want
  if amax:
    assert ref_scale(amax, fmt) == want


@settings(max_examples=hs.examples(20, 60), deadline=None)
@given(amax=hnp.arrays(np.float32, 64, elements=st.floats(float(F32(1e-30)), float(F32(1e30)),
                                                          width=32)),
       fmt=st.sampled_from(["e2m1", "e4m3"]))
def test_scale_matches_qwix_float32_steps(amax, fmt):
  _, scale_inv = jax.jit(lambda a: fp8jax.compute_scale(a, _spec(fmt)))(jnp.asarray(amax))
  want = np.array([ref_scale(a, fmt) for a in amax], np.float32)
  np.testing.assert_array_equal(np.asarray(scale_inv), want)


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3"])
def test_round_trip_of_a_block_is_qwix_division_and_cast(fmt):
  rng = np.random.default_rng(0)
  x = (rng.standard_normal((4, 64)) * np.exp(rng.uniform(-3, 3, (4, 1)))).astype(np.float32)
  x[0, 5] = QMAX[fmt] * 1.16  # a block maximum past the top: OAS moves it one binade up
  got = np.asarray(fp8jax.fake_quant(jnp.asarray(x), _spec(fmt)))
  want = np.empty_like(x)
  for r in range(4):
    for b in range(2):
      v = x[r, 32 * b:32 * (b + 1)]
      scale = F32(ref_scale(float(np.max(np.abs(v))), fmt))
      q = np.clip(v / scale, -QMAX[fmt], QMAX[fmt]).astype(DTYPE[fmt]).astype(np.float32)
      want[r, 32 * b:32 * (b + 1)] = q * scale
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_oas_refuses_formats_without_its_constant():
  with pytest.raises(ValueError, match="constants for"):
    fp8jax.preset("mxfp6_e2m3").replace(backward=None, pow2_rounding="oas")
