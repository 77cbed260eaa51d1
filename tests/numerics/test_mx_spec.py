"""MX (OCP Microscaling v1.0) and NVFP4 element formats against the specification.

The reference's own element rounding (``tests/references/reference_mx.py``) against ml_dtypes, and
the value sets, limits and presets against the OCP MX v1.0 tables, hard-coded from the
spec.
"""

import math

from hypothesis import given, settings
from hypothesis import strategies as st
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from tests.references import reference_mx as ref
from tests.references.mx_cases import FORMAT_BITS, FORMAT_NAMES, all_values

# ---------------------------------------------------------------------------------------
# the reference's own element rounding against ml_dtypes


def _probe_values(fmt: ref.Fmt) -> np.ndarray:
  """Grid points, ties, ties ± 1 float32 ulp, the range ends, subnormals, signed zeros."""
  codes = all_values(fmt.dtype)
  grid = np.unique(np.abs(codes[np.isfinite(codes)]).astype(np.float64))
  mids = (grid[:-1] + grid[1:]) / 2
  mids32 = mids.astype(np.float32)
  v = [grid, mids, np.nextafter(mids32, np.float32(np.inf)),
       np.nextafter(mids32, np.float32(0)),
       [fmt.max * (1 + 2.0**-(fmt.mantissa_bits + 1)), fmt.max * 1.01, fmt.max * 4, 1e38,
        np.inf, fmt.min_subnormal / 2, fmt.min_subnormal * 0.49, fmt.min_subnormal * 0.51,
        1e-30, 1e-40, 1.5e-45, 0.0]]
  rng = np.random.default_rng(0)
  v.append(np.exp2(rng.uniform(math.log2(fmt.min_subnormal) - 4, math.log2(fmt.max) + 2,
                               2000)))
  v = np.concatenate([np.asarray(a, np.float64) for a in v]).astype(np.float32)
  return np.concatenate([v, -v])


def _ml_dtypes_round(v: np.ndarray, fmt: ref.Fmt) -> np.ndarray:
  m = np.float32(fmt.max)
  return np.clip(v, -m, m).astype(fmt.dtype).astype(np.float32)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_reference_rounding_matches_ml_dtypes(name):
  """Own RNE (saturating) == clip then ml_dtypes cast: ties, ±1 ulp, ends, zeros."""
  fmt = ref.FORMATS[name]
  v = _probe_values(fmt)
  got = ref.round_array(v, fmt).astype(np.float32)
  assert not ref.mismatches(got, _ml_dtypes_round(v, fmt))
  assert np.signbit(got[v == 0]).tolist() == np.signbit(v[v == 0]).tolist()
  if fmt.has_nan:
    assert math.isnan(ref.round_nearest(math.nan, fmt))


@pytest.mark.parametrize("name", FORMAT_NAMES)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=64),
       st.integers(-20, 20))
@settings(max_examples=30, deadline=None)
def test_reference_rounding_matches_ml_dtypes_random(name, values, shift):
  """Same on arbitrary float32 values."""
  fmt = ref.FORMATS[name]
  with np.errstate(over="ignore"):
    v = (np.array(values, np.float32) * np.float32(2.0**shift)).astype(np.float32)
  got = ref.round_array(v, fmt).astype(np.float32)
  assert not ref.mismatches(got, _ml_dtypes_round(v, fmt))


def test_reference_hand_examples():
  """Worked by hand from the contract (OCP section 6.3 and the NVFP4 recipe)."""
  x = np.array([7.0, 1.25, -0.3, 0.2, -0.0], np.float32)
  r = ref.ref_quantize(x, "e2m1", (5,), pow2_rounding="ocp")
  # X = 2**(floor(log2 7) - 2) = 1: 7 saturates, 1.25 ties to 1, -0.3 -> -0.5.
  assert r.scale_inv.tolist() == [1.0]
  assert r.payload.astype(float).tolist() == [6.0, 1.0, -0.5, 0.0, -0.0]
  assert np.signbit(r.payload.astype(float)).tolist() == [0, 0, 1, 0, 1]
  r = ref.ref_quantize(x, "e2m1", (5,), pow2_rounding="rceil")
  # 7 / 6 -> 2: 3.5 ties to 4, 0.625 -> 0.5, -0.15 -> -0.
  assert r.scale_inv.tolist() == [2.0]
  assert r.payload.astype(float).tolist() == [4.0, 0.5, -0.0, 0.0, -0.0]
  x = np.array([2688.0, 1.0, 12.0, 5.0, 12.0, 7.0, 1e-3, -5e-4], np.float32)
  r = ref.ref_quantize(x, "e2m1", (2,), scale_format="e4m3")
  # G = 2688: S_enc = D = 1; block scales E4M3(amax / 6): 448, 2, and 1.7e-4 -> 0.
  assert float(r.tensor_scale_inv) == 1.0
  assert r.scale_inv.astype(float).tolist() == [448.0, 2.0, 2.0, 0.0]
  # 5 / 2 = 2.5 ties to 2; 7 / 2 = 3.5 ties to 4; sd = 0: enc = FLT_MAX, +-6, x_hat 0.
  assert r.payload.astype(float).tolist() == [6.0, 0.0, 6.0, 2.0, 6.0, 4.0, 6.0, -6.0]
  assert r.deq.tolist() == [2688.0, 0.0, 12.0, 4.0, 12.0, 8.0, 0.0, -0.0]
  assert np.signbit(r.deq).tolist() == [0, 0, 0, 0, 0, 0, 0, 1]


# ---------------------------------------------------------------------------------------
# value sets and limits against the OCP MX v1.0 tables (hard-coded from the spec)

# Section 5.3.3 (FP4 E2M1): exponent bias 1; ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; no inf/NaN.
E2M1_SPEC = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
# Sections 5.3.1 (OFP8) and 5.3.2 (FP6): bias, max normal, min normal, max subnormal,
# min subnormal, number of NaN codes, number of inf codes.
SPEC_LIMITS = {
    "e4m3": (7, 2.0**8 * 1.75, 2.0**-6, 2.0**-6 * 0.875, 2.0**-9, 2, 0),
    "e5m2": (15, 2.0**15 * 1.75, 2.0**-14, 2.0**-14 * 0.75, 2.0**-16, 6, 2),
    "e2m3": (1, 2.0**2 * 1.875, 1.0, 0.875, 0.125, 0, 0),
    "e3m2": (3, 2.0**4 * 1.75, 0.25, 0.1875, 0.0625, 0, 0),
    "e2m1": (1, 2.0**2 * 1.5, 1.0, 0.5, 0.5, 0, 0),
}


def _spec_grid(bias, mbits, max_normal):
  """Positive finite values from the spec's encoding rule (subnormals, then normals)."""
  emin = 1 - bias
  sub = [k * 2.0**emin / 2**mbits for k in range(2**mbits)]
  normal = [(1 + k / 2**mbits) * 2.0**e for e in range(emin, 64) for k in range(2**mbits)]
  return sorted(v for v in sub + normal if v <= max_normal)


def test_e2m1_value_set_matches_the_spec():
  """All 16 E2M1 codes (ml_dtypes) hold exactly the spec's values."""
  values = all_values(ml_dtypes.float4_e2m1fn)
  assert sorted(set(np.abs(values).tolist())) == E2M1_SPEC
  assert sorted(values.tolist()) == sorted([-v for v in E2M1_SPEC] + E2M1_SPEC)
  assert np.all(np.isfinite(values))


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_element_value_sets_match_the_spec(name):
  """All codes (ml_dtypes) vs the spec's encoding rule and limits; ties to even."""
  bias, vmax, min_normal, max_sub, min_sub, n_nan, n_inf = SPEC_LIMITS[name]
  fmt = ref.FORMATS[name]
  values = all_values(fmt.dtype)
  assert int(np.isnan(values).sum()) == n_nan and int(np.isinf(values).sum()) == n_inf
  finite = values[np.isfinite(values)]
  grid = sorted(set(np.abs(finite).tolist()))
  assert grid == _spec_grid(bias, fmt.mantissa_bits, vmax)
  assert (grid[-1], grid[1]) == (vmax, min_sub)
  assert max(v for v in grid if v < min_normal) == max_sub
  # The reference's own table agrees with the spec.
  assert (fmt.max, fmt.min_normal, fmt.min_subnormal) == (vmax, min_normal, min_sub)
  assert fmt.emax == math.floor(math.log2(vmax)) and (fmt.has_nan, fmt.has_inf) == (
      n_nan > 0, n_inf > 0)
  # Ties go to the code with an even mantissa (last bit 0): check on the reference.
  codes = np.arange(2 ** FORMAT_BITS[name], dtype=np.uint8)
  by_value = {float(v): int(c) for c, v in zip(codes, codes.view(fmt.dtype).astype(float))
              if np.isfinite(v) and v >= 0 and not (v == 0 and c != 0)}
  for lo, hi in zip(grid[:-1], grid[1:]):
    even = lo if by_value[lo] % 2 == 0 else hi
    assert ref.round_nearest((lo + hi) / 2, fmt) == even


def test_e8m0_value_set_matches_the_spec():
  """All 256 E8M0 codes vs section 5.4.1."""
  # Section 5.4.1: E8M0 = unsigned 8-bit exponent, bias 127, 2**-127 .. 2**127,
  # 0xFF = NaN, no zero, no infinity, no sign.
  values = all_values(ml_dtypes.float8_e8m0fnu)
  assert math.isnan(values[255])
  assert values[:255].tolist() == [2.0 ** (c - 127) for c in range(255)]
  assert values[0] == 2.0**-127 and values[254] == 2.0**127
  assert not np.any(values[:255] <= 0)
  # Every scale the MX rules produce, 2**-126 .. 2**126, is stored exactly.
  scales = np.array([2.0**k for k in range(-126, 127)], np.float32)
  assert np.array_equal(scales.astype(ml_dtypes.float8_e8m0fnu).astype(np.float32), scales)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_get_format_facts(name):
  """fp8jax.get_format fields vs the spec table."""
  fmt = ref.FORMATS[name]
  got = fp8jax.get_format(name)
  assert got.name == name
  assert np.dtype(got.dtype) == np.dtype(fmt.dtype)
  assert np.dtype(got.storage_dtype) == np.dtype(fmt.storage)
  assert (got.max, got.min_normal, got.min_subnormal) == (fmt.max, fmt.min_normal,
                                                         fmt.min_subnormal)
  assert (got.mantissa_bits, got.emax, got.has_inf, got.has_nan) == (
      fmt.mantissa_bits, fmt.emax, fmt.has_inf, fmt.has_nan)
  dtype_name = np.dtype(fmt.dtype).name
  assert fp8jax.get_format(dtype_name) == got
  with pytest.raises((AttributeError, TypeError)):  # frozen
    got.max = 1.0


def _preset_table():
  e8 = dict(scale_format="pow2", store_e8m0=True, rounding="nearest")
  nv = dict(scale_format="e4m3", store_e8m0=False)
  t32, t16 = fp8jax.tile(32), fp8jax.tile(16)
  return {
      "mxfp8": dict(format="e4m3", granularity=t32, pow2_rounding="rceil", **e8),
      "mxfp8_ocp": dict(format="e4m3", granularity=t32, pow2_rounding="ocp", **e8),
      "mxfp8_e5m2": dict(format="e5m2", granularity=t32, pow2_rounding="rceil", **e8),
      "mxfp6_e2m3": dict(format="e2m3", granularity=t32, pow2_rounding="ocp", **e8),
      "mxfp6_e3m2": dict(format="e3m2", granularity=t32, pow2_rounding="ocp", **e8),
      "mxfp4": dict(format="e2m1", granularity=t32, pow2_rounding="ocp", **e8),
      "mxfp4_rceil": dict(format="e2m1", granularity=t32, pow2_rounding="rceil", **e8),
      "nvfp4": dict(format="e2m1", granularity=t16, rounding="nearest", **nv),
      "nvfp4_weight": dict(format="e2m1", granularity=fp8jax.block((16, 16)),
                           rounding="nearest", **nv),
      "nvfp4_sr": dict(format="e2m1", granularity=t16, rounding="stochastic", sr_bits=8,
                       **nv),
      "nvfp4_row_scaled": dict(format="e2m1", granularity=t16, rounding="nearest",
                               row_scaled=True, **nv),
      "nvfp4_ue5m3": dict(format="e2m1", granularity=t16, rounding="nearest",
                          scale_format="ue5m3", store_e8m0=False, row_scaled=False),
  }


def test_preset_fields():
  """Every MX / NVFP4 preset as the contract lists it."""
  for name, fields in _preset_table().items():
    spec = fp8jax.preset(name)
    got = {k: getattr(spec, k) for k in fields}
    assert got == fields, name
    g = spec.granularity
    assert (g.kind, g.axes, g.sizes) == {
        "tile": ("tile", (-1,), (fields["granularity"].sizes[0],)),
        "block": ("block", (-2, -1), (16, 16))}[g.kind], name
    assert spec.margin == 0 and spec.scaling == "current", name
