"""The uniform 4-bit grids E1M2 and INT4 (fp8jax/numerics/formats.py, arXiv 2606.20381):
their values against a NumPy enumeration written from the bit layouts, the rounding
against nearest-even on that enumeration (hypothesis), INT4 payloads against ml_dtypes'
int4, E1M2 casts against Huawei's en_dtypes where it is installed, and NVFP4-style
two-level quantization with them against a float32 loop."""

from hypothesis import given, settings
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from fp8jax.numerics import formats
from tests import strategies as hs

F32 = np.float32
_round = jax.jit(formats.round_to_format, static_argnums=1)


def e1m2_values() -> np.ndarray:
  """All 16 codes of E1M2 (sign, 1 exponent bit with bias 1, 2 mantissa bits; exponent 0
  subnormal, no inf or NaN), decoded."""
  out = []
  for code in range(16):
    sign, e, m = code >> 3, (code >> 2) & 1, code & 3
    mag = (m / 4) * 2.0**0 if e == 0 else (1 + m / 4) * 2.0 ** (e - 1)
    out.append(-mag if sign else mag)
  return np.array(out, np.float64)


def int4_values() -> np.ndarray:
  """The symmetric INT4 grid: the integers -7..7 (two's complement -8 unused)."""
  return np.arange(-7, 8, dtype=np.float64)


GRIDS = {"e1m2": e1m2_values, "int4": int4_values}


def nearest_even(v: np.ndarray, grid: np.ndarray) -> np.ndarray:
  """``v`` (float64) to the nearest grid value, ties to the one with an even index among the
  non-negative magnitudes (the even code), saturating at the largest, the sign kept."""
  mags = np.unique(np.abs(grid))
  a = np.minimum(np.abs(v), mags[-1])
  i = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
  lo, hi = mags[i - 1], mags[i]
  pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (i % 2 == 0))
  return np.copysign(np.where(pick_hi, hi, lo), v)


def test_grids_and_facts():
  for name, values in GRIDS.items():
    fmt = formats.get_format(name)
    grid = np.unique(np.abs(values()))
    assert len(grid) == 8 and np.allclose(np.diff(grid), grid[1])  # uniform, 15 values
    assert (fmt.max, fmt.min_subnormal, fmt.bits, fmt.has_nan, fmt.has_inf) == (
        grid[-1], grid[1], 4, False, False)
  np.testing.assert_array_equal(np.unique(np.abs(e1m2_values())) * 4,
                                np.unique(np.abs(int4_values())))
  assert formats.canonical_format_name("float4_e1m2") == "e1m2"


@settings(max_examples=hs.examples(40, 200), deadline=None)
@given(name=st.sampled_from(sorted(GRIDS)),
       x=hnp.arrays(np.float32, 64, elements=st.floats(-10, 10, width=32)))
def test_round_to_format_is_nearest_even_on_the_grid(name, x):
  fmt = formats.get_format(name)
  x = x * (0.25 if name == "e1m2" else 1.0)
  got = np.asarray(_round(jnp.asarray(x), fmt), np.float64)
  want = nearest_even(x.astype(np.float64), GRIDS[name]())
  np.testing.assert_array_equal(got, want)
  assert (np.signbit(got) == np.signbit(x)).all()


def test_ties_nan_inf_and_storage():
  e1m2, int4 = formats.get_format("e1m2"), formats.get_format("int4")
  x = np.array([0.125, 0.375, 1.625, 1.875, -9.0, np.inf, np.nan], np.float32)
  got = np.asarray(formats.saturating_cast(jnp.asarray(x), e1m2), np.float32)
  np.testing.assert_array_equal(got, [0.0, 0.5, 1.5, 1.75, -1.75, 1.75, 0.0])
  y = np.array([0.5, 1.5, 2.5, 6.5, 7.5, -100, np.nan], np.float32)
  q = formats.saturating_cast(jnp.asarray(y), int4)
  assert q.dtype == jnp.int4
  np.testing.assert_array_equal(np.asarray(q).astype(np.int8), [0, 2, 2, 6, 7, -7, 0])
  # every grid value survives ml_dtypes' int4 and E4M3 (E1M2's storage) exactly
  np.testing.assert_array_equal(int4_values().astype(ml_dtypes.int4).astype(np.float64),
                                int4_values())
  np.testing.assert_array_equal(
      e1m2_values().astype(ml_dtypes.float8_e4m3fn).astype(np.float64), e1m2_values())


def test_e1m2_matches_en_dtypes_where_installed():
  en = pytest.importorskip("en_dtypes")
  codes = np.arange(16, dtype=np.uint8).view(en.float4_e1m2).astype(np.float64)
  np.testing.assert_array_equal(codes, e1m2_values())
  x = np.random.default_rng(0).uniform(-2.5, 2.5, 4096).astype(np.float32)
  got = np.asarray(formats.round_to_format(jnp.asarray(x), formats.get_format("e1m2")))
  np.testing.assert_array_equal(got, x.astype(en.float4_e1m2).astype(np.float32))


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_two_level_blocks_as_nvfp4_with_the_grid(name):
  """1 x 16 blocks, E4M3 block scales over an FP32 tensor level (NVFP4's order with the
  grid's maximum ``e``), against a float32 loop: payloads and scales bit for bit."""
  spec = fp8jax.preset("nvfp4").replace(backward=None, format=name)
  x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32) * 5
  qt = jax.jit(lambda v: fp8jax.quantize(v, spec))(jnp.asarray(x))
  e = F32(GRIDS[name]().max())
  g = F32(np.abs(x).max())
  s_enc = F32(F32(F32(448.0) * e) / g)
  d = F32(F32(1.0) / s_enc)
  grid = GRIDS[name]()
  for r in range(3):
    for b in range(4):
      vals = x[r, 16 * b:16 * b + 16]
      sd = F32(F32(min(F32(np.abs(vals).max() * F32(s_enc * F32(F32(1.0) / e))), 448.0))
               .astype(ml_dtypes.float8_e4m3fn).astype(F32))
      s = F32(F32(1.0) / F32(sd * d))
      want = nearest_even((vals * s).astype(np.float64), grid)
      np.testing.assert_array_equal(np.asarray(qt.data[r, 16 * b:16 * b + 16], np.float64), want)
      assert F32(np.asarray(qt.scale_inv[r, b], np.float32)) == sd
