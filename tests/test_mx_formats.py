"""MX (OCP Microscaling v1.0) and NVFP4 formats against the independent reference.

The reference (``tests/reference_mx.py``) is written from the contract and the OCP MX
v1.0 specification only. Payloads, scales and dequantized values are compared bit for
bit; stochastic rounding is checked for its support, determinism and unbiasedness.
"""

import math

from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from fp8jax.quant import fused_round_trip
from tests import reference_mx as ref

FORMAT_NAMES = sorted(ref.FORMATS)
MX_PRESETS = ["mxfp8", "mxfp8_ocp", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4",
              "mxfp4_rceil"]
NV_PRESETS = ["nvfp4", "nvfp4_weight"]
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
# A few shapes (so that compiled kernels are reused), rank 1-3, with last dims that
# 16 and 32 do not divide, and dims smaller than a tile.
SHAPES = [(70,), (1,), (33,), (3, 33), (2, 48), (17, 20), (32, 32), (2, 3, 40), (1, 5, 7)]
FEW = settings(max_examples=4, deadline=None)
MANY = settings(max_examples=15, deadline=None)


# ---------------------------------------------------------------------------------------
# 1. the reference's own element rounding against ml_dtypes


def _probe_values(fmt: ref.Fmt) -> np.ndarray:
  """Grid points, ties, ties ± 1 float32 ulp, the range ends, subnormals, signed zeros."""
  codes = _all_values(fmt.dtype)
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
# 2. value sets and limits against the OCP MX v1.0 tables (hard-coded from the spec)

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
FORMAT_BITS = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4}


def _all_values(dtype) -> np.ndarray:
  """Every code of an ml_dtypes type (4/6/8 bits in a byte), as float64."""
  bits = next((b for n, b in FORMAT_BITS.items() if ref.FORMATS[n].dtype == dtype), 8)
  codes = np.arange(2**bits, dtype=np.uint8).view(dtype)
  return codes.astype(np.float64)


def _spec_grid(bias, mbits, max_normal):
  """Positive finite values from the spec's encoding rule (subnormals, then normals)."""
  emin = 1 - bias
  sub = [k * 2.0**emin / 2**mbits for k in range(2**mbits)]
  normal = [(1 + k / 2**mbits) * 2.0**e for e in range(emin, 64) for k in range(2**mbits)]
  return sorted(v for v in sub + normal if v <= max_normal)


def test_e2m1_value_set_matches_the_spec():
  """All 16 E2M1 codes (ml_dtypes) hold exactly the spec's values."""
  values = _all_values(ml_dtypes.float4_e2m1fn)
  assert sorted(set(np.abs(values).tolist())) == E2M1_SPEC
  assert sorted(values.tolist()) == sorted([-v for v in E2M1_SPEC] + E2M1_SPEC)
  assert np.all(np.isfinite(values))


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_element_value_sets_match_the_spec(name):
  """All codes (ml_dtypes) vs the spec's encoding rule and limits; ties to even."""
  bias, vmax, min_normal, max_sub, min_sub, n_nan, n_inf = SPEC_LIMITS[name]
  fmt = ref.FORMATS[name]
  values = _all_values(fmt.dtype)
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
  values = _all_values(ml_dtypes.float8_e8m0fnu)
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
      "nvfp4_sr": dict(format="e2m1", granularity=t16, rounding="stochastic", **nv),
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


# ---------------------------------------------------------------------------------------
# 3. bit-exact payloads and scales against the reference


@st.composite
def mx_arrays(draw, shapes=tuple(SHAPES), dtypes=tuple(DTYPES)):
  """Arrays whose 16-element runs each sit in their own binade range.

  Runs far apart give tiny blocks next to huge ones (NVFP4 block scales of 0), wide
  runs put elements into the element format's subnormal range, dyadic mantissas make
  exact ties, and there are zero runs, signed zeros, float32 subnormals, inf and NaN.
  Hypothesis draws the shape, dtype and a seed; the mix is drawn from the seed run by
  run, so that even the simplest (derandomized) examples hold every kind of run.
  """
  shape = draw(st.sampled_from(shapes))
  dtype = draw(st.sampled_from(dtypes))
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  n = math.prod(shape)
  n_runs = n // 16 + 1
  center = int(rng.integers(-100, 101))
  wide = int(rng.choice([0, 3, 24, 120]))
  run_exp = center + rng.integers(-wide, wide + 1, n_runs)
  run_within = rng.choice([0, 2, 6, 14, 40], n_runs)
  run_dyadic = rng.random(n_runs) < 0.5  # 5-bit mantissas: exact ties for every format
  run_zero = rng.random(n_runs) < 0.1
  per = lambda v: np.repeat(v, 16)[:n]
  exps = per(run_exp) - (rng.random(n) * (per(run_within) + 1)).astype(np.int64)
  exps = np.clip(exps, -140, 127)
  mant = np.where(per(run_dyadic), rng.integers(16, 32, n) / 16, rng.uniform(1, 2, n))
  x = rng.choice([-1.0, 1.0], n) * mant * np.exp2(exps.astype(np.float64))
  x[per(run_zero)] = 0.0
  zeros = rng.random(n) < 0.05
  x[zeros] = rng.choice([0.0, -0.0], int(zeros.sum()))
  if rng.random() < 0.5:
    k = int(rng.integers(1, 4))
    x[rng.integers(0, n, k)] = rng.choice([np.nan, np.inf, -np.inf], k)
  with np.errstate(over="ignore"):
    return x.astype(DTYPES[dtype]).reshape(shape)


def _np(a):
  return None if a is None else np.asarray(a)


_quantize_jit = jax.jit(fp8jax.quantize, static_argnums=1)
_dequantize_jit = jax.jit(fp8jax.dequantize, static_argnums=1)
_QDQ_PATHS = {"quantize_dequantize": fp8jax.quantize_dequantize,
              "fused": fused_round_trip.quantize_dequantize_fused, "fake_quant": fp8jax.fake_quant}
_QDQ_JIT = {k: jax.jit(f, static_argnums=1) for k, f in _QDQ_PATHS.items()}


def _check_quantize(x, spec, jit=True):
  """quantize and dequantize (jitted, or eager) vs the reference: payload, scales,
  block, values."""
  r = ref.ref_for_spec(x, spec)
  qt = (_quantize_jit if jit else fp8jax.quantize)(jnp.asarray(x), spec)
  data, scale_inv = _np(qt.data), _np(qt.scale_inv)
  info = f"spec={spec.describe()} x.shape={x.shape} x.dtype={x.dtype}"
  assert tuple(qt.block) == r.block, info
  errs = ref.mismatches(data, r.payload, mask=~r.unspecified)
  assert not errs, f"payload: {info}\n" + "\n".join(errs)
  errs = ref.mismatches(scale_inv, r.scale_inv)
  assert not errs, f"scale_inv: {info}\n" + "\n".join(errs)
  if r.tensor_scale_inv is None:
    assert qt.tensor_scale_inv is None, info
  else:
    got = _np(qt.tensor_scale_inv)
    assert got.dtype == np.float32 and got.shape == (), info
    assert ref.bits(got) == ref.bits(r.tensor_scale_inv), (info, got, r.tensor_scale_inv)
  deq = _np(_dequantize_jit(qt, None) if jit else fp8jax.dequantize(qt))
  errs = ref.mismatches(deq, r.deq)
  assert not errs, f"dequantized: {info}\n" + "\n".join(errs)
  return r


def _preset_case(name, x, jit=True):
  spec = fp8jax.preset(name)
  if spec.granularity.kind == "block" and x.ndim < 2:
    x = x.reshape(1, -1)
  _check_quantize(x, spec, jit)


@pytest.mark.parametrize("name", MX_PRESETS + NV_PRESETS)
@given(x=mx_arrays())
@FEW
def test_presets_match_reference_bit_for_bit(name, x):
  """Payload, scale_inv, tensor_scale_inv and dequantized bits of every preset."""
  _preset_case(name, x)


@pytest.mark.thorough
@pytest.mark.parametrize("name", MX_PRESETS + NV_PRESETS)
@given(x=mx_arrays())
@MANY
def test_presets_match_reference_thorough(name, x):
  """Eager (op by op) this time."""
  _preset_case(name, x, jit=False)


@st.composite
def mx_specs(draw):
  """Any element format x tile(32) / tile(16) / block((16, 16)) / tile(32, -2) x any
  scale rule (MX power-of-two rules, FP32, NVFP4 two-level)."""
  fmt = draw(st.sampled_from(FORMAT_NAMES))
  gran = draw(st.sampled_from([fp8jax.tile(32), fp8jax.tile(16), fp8jax.block((16, 16)),
                               fp8jax.tile(32, -2)]))
  scale = draw(st.sampled_from(["ocp", "rceil", "floor", "fp32", "e4m3"]))
  eps = draw(st.sampled_from([0.0, 1e-12]))
  if scale in ("fp32", "e4m3"):
    return fp8jax.QuantSpec(format=fmt, granularity=gran, scale_format=scale, eps=eps)
  return fp8jax.QuantSpec(format=fmt, granularity=gran, scale_format="pow2",
                          pow2_rounding=scale, store_e8m0=draw(st.booleans()), eps=eps)


def _any_case(x, spec):
  if x.ndim < 2 and spec.granularity.axes != (-1,):
    x = x.reshape(1, -1)
  _check_quantize(x, spec)


@given(x=mx_arrays(), spec=mx_specs())
@settings(max_examples=25, deadline=None)
def test_any_format_and_rule_matches_reference(x, spec):
  """Random format x granularity x scale rule x eps, bit for bit."""
  _any_case(x, spec)


@pytest.mark.thorough
@given(x=mx_arrays(), spec=mx_specs())
@settings(max_examples=100, deadline=None)
def test_any_format_and_rule_matches_reference_thorough(x, spec):
  """More examples of the same."""
  _any_case(x, spec)


def _nan_block_case(name):
  x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
  x[0, 5], x[1, 7], x[1, 8] = np.nan, np.inf, -np.inf
  return x, fp8jax.preset(name)


@pytest.mark.parametrize("name", ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "nvfp4", "mxfp8"])
def test_nan_and_inf_handling(name):
  """A block holding NaN or ±inf has a NaN scale (E8M0 0xFF, E4M3 NaN) and dequantizes to
  NaN as a whole; its payload is x saturated (inf -> ±max, NaN -> +0 where the format
  has no NaN); the other blocks are untouched."""
  x, spec = _nan_block_case(name)
  r = _check_quantize(x, spec)
  qt = _quantize_jit(jnp.asarray(x), spec)
  deq = np.asarray(_dequantize_jit(qt, None))
  fmt = ref.fmt_of(spec.format)
  payload = np.asarray(qt.data).astype(np.float32)
  width = 16 if name == "nvfp4" else 32
  assert np.all(np.isnan(deq[0, :width])) and np.all(np.isnan(deq[1, :width]))
  assert not np.any(np.isnan(deq[:, width:]))
  assert np.all(np.isnan(np.asarray(qt.scale_inv, np.float32)[:, 0]))
  if not fmt.has_nan:
    assert ref.bits(np.asarray(qt.data)[0, 5]) == 0  # +0 payload
  assert (payload[1, 7], payload[1, 8]) == (fmt.max, -fmt.max)
  assert r.scale_inv.shape == np.asarray(qt.scale_inv).shape


def _edge_cases():
  """Inputs at the ends of the float32 range, all-zero and all-non-finite blocks."""
  ramp = np.linspace(1, 2, 80).reshape(2, 40)
  cases = {
      "zeros": np.zeros((2, 40)),
      "tiny": ramp * 1e-38,  # scales clamp at 2**-126 / NVFP4 S_enc at 2**126
      "tiny_runs": ramp * 2.0**-120 * np.where(np.arange(40) < 16, 2.0**-20, 1),
      "huge": np.full((2, 40), 3e38),
      "nonfinite": np.array([[np.nan, np.inf, -np.inf] + [0.0] * 37] * 2),
      "f32_subnormal": np.linspace(-1, 1, 80).reshape(2, 40) * 1e-39,
      "element_subnormals": ramp * np.where(np.arange(40) % 16 == 0, 1.0, 2.0**-9),
  }
  cases["huge"][0, 3] = np.inf
  cases["element_subnormals"][1, 5] = -0.0
  return cases


def _edge_case(name, eps, dtype, jit=True):
  spec = fp8jax.preset(name)
  if eps is not None:
    spec = spec.replace(eps=eps)
  for case, x in _edge_cases().items():
    x = x.astype(np.float32).astype(DTYPES[dtype])
    try:
      _check_quantize(x, spec, jit)
    except AssertionError as e:
      raise AssertionError(f"case {case}: {e}") from e
  # dequantize to another dtype than the input's
  x = _edge_cases()["element_subnormals"].astype(DTYPES[dtype])
  other = np.float32 if dtype == "bfloat16" else ml_dtypes.bfloat16
  want = ref.ref_for_spec(x, spec, out_dtype=other).deq
  got = np.asarray(fp8jax.dequantize(fp8jax.quantize(jnp.asarray(x), spec), other))
  assert not ref.mismatches(got, want)


@pytest.mark.parametrize("name,eps", [("mxfp8", 0.0), ("mxfp4", None), ("mxfp6_e3m2", 0.0),
                                      ("nvfp4", 0.0), ("nvfp4_weight", None)])
def test_edge_cases_match_reference(name, eps):
  """Range ends, zero / non-finite blocks, FTZ inputs, another output dtype."""
  _edge_case(name, eps, "float32")


@pytest.mark.thorough
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("eps", [None, 0.0])
@pytest.mark.parametrize("name", MX_PRESETS + NV_PRESETS)
def test_edge_cases_match_reference_thorough(name, eps, dtype):
  """Same, every preset x eps x dtype, eager."""
  _edge_case(name, eps, dtype, jit=False)


def _boundary_input(spec, seed, rows=48):
  """float32 (rows, 16): each row one block with its amax first and 15 elements whose
  scaled values x * enc sit on, or one float32 ulp either side of, a grid point or a
  tie of the element format; the scales enc are taken from the reference."""
  rng = np.random.default_rng(seed)
  fmt = ref.fmt_of(spec.format)
  grid = np.unique(np.abs(_all_values(fmt.dtype)[np.isfinite(_all_values(fmt.dtype))]))
  targets = np.concatenate([grid[1:], (grid[:-1] + grid[1:]) / 2])
  targets = targets[targets < fmt.max * 0.8]
  g = np.float32(2.0 ** rng.uniform(-20, 20))
  amax = (g * np.exp2(-rng.uniform(0, 18, rows))).astype(np.float32)
  if spec.scale_format == "e4m3":  # half the block amaxes put d = amax * m on E4M3 ties
    s_enc, _ = ref.nvfp4_tensor_scale(float(g), fmt, spec.eps)
    m = ref.f32(s_enc * ref.f32(1.0 / fmt.max))
    e4m3 = np.unique(np.abs(_all_values(ml_dtypes.float8_e4m3fn)))
    e4m3 = e4m3[np.isfinite(e4m3)]
    ties = (e4m3[:-1] + e4m3[1:]) / 2
    ties = ties[(ties > 2.0**-8) & (ties < 400)]
    pick = (rng.choice(ties, rows // 2) / m).astype(np.float32)
    pick = np.nextafter(pick, np.where(rng.random(rows // 2) < 0.5, -np.inf, np.inf)
                        .astype(np.float32)) if seed % 2 else pick
    amax[1::2] = np.minimum(pick, g)
  amax[0] = g
  x = np.zeros((rows, 16), np.float32)
  x[:, 0] = amax
  enc = ref.ref_for_spec(x, spec).enc.reshape(rows)
  t = np.zeros((rows, 15))
  for r in range(rows):  # below the row's own amax * enc (a coarse E4M3 sd may be low)
    ok = targets[targets < 0.8 * float(amax[r]) * float(enc[r])]
    if ok.size:
      t[r] = rng.choice(ok, 15) * rng.choice([-1, 1], 15)
  v = (t / enc[:, None].astype(np.float64)).astype(np.float32)
  for step in range(int(rng.integers(0, 3)) + 1):
    del step
    nudge = rng.integers(-1, 2, v.shape)
    v = np.where(nudge > 0, np.nextafter(v, np.float32(np.inf)),
                 np.where(nudge < 0, np.nextafter(v, np.float32(-np.inf)), v))
  x[:, 1:] = v
  assert np.all(np.abs(x[:, 1:]) < x[:, :1])
  return x


@pytest.mark.parametrize("spec", [
    fp8jax.preset("nvfp4"),
    fp8jax.QuantSpec(format="e2m1", granularity=fp8jax.tile(16), scale_format="fp32"),
    fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.tile(16), scale_format="fp32"),
    fp8jax.QuantSpec(format="e3m2", granularity=fp8jax.tile(16), scale_format="e4m3"),
], ids=lambda spec: spec.describe().split(" |")[0])
def test_scaled_values_at_rounding_boundaries(spec):
  """Non-power-of-two scales (NVFP4, FP32): x * enc lands on ties and grid points to
  the float32 ulp, so every float32 rounding of the scale formulas shows."""
  for seed in range(4):
    _check_quantize(_boundary_input(spec, seed), spec)


@pytest.mark.parametrize("name", ["mxfp8", "mxfp8_e5m2", "mxfp4_rceil"])
def test_round_up_rule_at_exact_powers_of_two(name):
  """rceil: amax = max_elem * 2**k gives scale_inv = 2**k exactly (no round-up); one
  float32 ulp more gives 2**(k + 1); far ends clamp to 2**-126 and 2**126. (eps = 0;
  a float32-subnormal amax is flushed to 0 on CPU, so its scale is 1.)"""
  spec = fp8jax.preset(name).replace(eps=0.0)
  fmax = np.float32(ref.fmt_of(spec.format).max)
  ks = [-131, -130, -126, -100, -3, 0, 5, 60, 110, 126]
  amax = [np.float32(float(fmax) * 2.0**k) for k in ks if float(fmax) * 2.0**k < 3e38]
  amax += [np.nextafter(a, np.float32(np.inf)) for a in amax]
  x = np.zeros((len(amax), 32), np.float32)
  x[:, 0] = amax
  x[:, 1] = np.float32(0.3) * x[:, 0]
  qt = _quantize_jit(jnp.asarray(x), spec)
  got = np.asarray(qt.scale_inv).astype(np.float64)[:, 0]
  n = len(amax) // 2
  for a, s, s_up in zip(amax[:n], got[:n], got[n:]):
    if a < 2.0**-126:
      assert s == s_up == 1.0, (a, s, s_up)
      continue
    k = ref.floor_log2(float(a) / float(fmax))
    assert s == 2.0 ** min(max(k, -126), 126), (a, s)
    assert s_up == 2.0 ** min(max(k + 1, -126), 126), (a, s_up)
  _check_quantize(x, spec)


def test_nvfp4_zero_block_scale_next_to_huge_block():
  """A block far below the tensor amax gets sd = 0 and dequantizes to zeros."""
  x = np.ones((1, 32), np.float32)
  x[0, :16] *= 1e20
  x[0, 16:] = np.linspace(1, 2, 16) * 1e-3
  r = _check_quantize(x, fp8jax.preset("nvfp4"))
  assert r.scale_inv.astype(np.float32)[0, 1] == 0
  assert np.all(r.deq[0, 16:] == 0)


# ---------------------------------------------------------------------------------------
# 4. quantize_dequantize == fused == fake_quant forward


def _qdq_case(name, x, jit=True):
  spec = fp8jax.preset(name)
  if spec.granularity.kind == "block" and x.ndim < 2:
    x = x.reshape(1, -1)
  want = ref.ref_for_spec(x, spec).deq
  xj = jnp.asarray(x)
  outs = {k: f(xj, spec) for k, f in (_QDQ_JIT if jit else _QDQ_PATHS).items()}
  for what, got in outs.items():
    errs = ref.mismatches(np.asarray(got), want)
    assert not errs, f"{what} {spec.describe()} {x.dtype}{x.shape}\n" + "\n".join(errs)


@pytest.mark.parametrize("name", MX_PRESETS + NV_PRESETS)
@given(x=mx_arrays(shapes=[(2, 3, 40)]))  # one shape (compiled once per dtype)
@FEW
def test_qdq_fused_and_fake_quant_agree_bit_for_bit(name, x):
  """quantize_dequantize == fused == fake_quant forward == reference, bit for bit."""
  _qdq_case(name, x)


@pytest.mark.thorough
@pytest.mark.parametrize("name", MX_PRESETS + NV_PRESETS)
@given(x=mx_arrays())
@MANY
def test_qdq_fused_and_fake_quant_thorough(name, x):
  """Eager this time."""
  _qdq_case(name, x, jit=False)


# ---------------------------------------------------------------------------------------
# 5. the OCP rule saturates one binade; the round-up rule does not


@pytest.mark.parametrize("ocp,rceil,top,k", [
    ("mxfp8_ocp", "mxfp8", 500.0, 0), ("mxfp8_ocp", "mxfp8", 500.0, -20),
    ("mxfp8_ocp", "mxfp8", 500.0, 30), ("mxfp4", "mxfp4_rceil", 7.0, 0),
    ("mxfp4", "mxfp4_rceil", 7.0, -9), ("mxfp4", "mxfp4_rceil", 6.5, 11)])
def test_ocp_saturates_where_round_up_does_not(ocp, rceil, top, k):
  """amax = top * 2**k: "ocp" gives 2**k and saturates amax / 2**k = top > max;
  "rceil" gives 2**(k + 1), one binade more, and nothing saturates (eager here)."""
  x = np.linspace(-1, 1, 32, dtype=np.float32) * np.float32(2.0**k)
  x[3] = top * 2.0**k
  q_ocp = fp8jax.quantize(jnp.asarray(x), fp8jax.preset(ocp))
  q_up = fp8jax.quantize(jnp.asarray(x), fp8jax.preset(rceil))
  fmax = fp8jax.get_format(fp8jax.preset(ocp).format).max
  p_ocp = np.asarray(q_ocp.data).astype(np.float32)
  p_up = np.asarray(q_up.data).astype(np.float32)
  # OCP section 6.3: X = 2**(floor(log2 amax) - emax_elem) = 2**k.
  assert p_ocp[3] == fmax and np.asarray(q_ocp.scale_inv).astype(np.float32)[0] == 2.0**k
  assert p_up[3] < fmax
  ratio = (np.asarray(q_up.scale_inv).astype(np.float32)
           / np.asarray(q_ocp.scale_inv).astype(np.float32))
  assert ratio.tolist() == [2.0]
  for name in (ocp, rceil):
    _check_quantize(x, fp8jax.preset(name), jit=False)


# ---------------------------------------------------------------------------------------
# 6. stochastic rounding


def _sr_specs():
  sr = dict(rounding="stochastic")
  return {"nvfp4_sr": fp8jax.preset("nvfp4_sr"),
          "mxfp4_sr": fp8jax.preset("mxfp4").replace(**sr),
          "mxfp8_sr": fp8jax.preset("mxfp8").replace(**sr),
          "mxfp6_e2m3_sr": fp8jax.preset("mxfp6_e2m3").replace(**sr),
          "nvfp4_weight_sr": fp8jax.preset("nvfp4_weight").replace(**sr)}


def _between_grid(n, rng):
  """Signed magnitudes in [0.02, 1): mostly off the grid once scaled."""
  return (rng.uniform(0.02, 1.0, n) * rng.choice([-1, 1], n)).astype(np.float32)


@pytest.mark.parametrize("name", ["nvfp4_sr", "mxfp4_sr", "mxfp8_sr", "mxfp6_e2m3_sr",
                                  "nvfp4_weight_sr"])
def test_stochastic_payload_is_a_neighbour(name):
  """Scales as with rounding to nearest; every payload is one of the two grid
  neighbours of x * enc with its sign, ±max at or beyond max, +0 for a NaN (FP4/FP6)."""
  spec = _sr_specs()[name]
  rng = np.random.default_rng(1)
  x = (rng.standard_normal((8, 96)) * np.exp2(rng.integers(-30, 30, (8, 1)))).astype(
      np.float32)
  x[0, :16] = 0.0
  x[1, 3], x[2, 4], x[3, 5] = np.nan, np.inf, -np.inf  # one 16 x 16 block, three tiles
  x[4, 2] = x[4, 0] * 1e-7  # below the smallest subnormal: 0 or the smallest subnormal
  r = ref.ref_for_spec(x, spec.replace(rounding="nearest"))
  fmt = ref.fmt_of(spec.format)
  qt = _quantize_jit(jnp.asarray(x), spec, key=jax.random.key(7))
  assert not ref.mismatches(np.asarray(qt.scale_inv), r.scale_inv)
  if r.tensor_scale_inv is not None:
    assert ref.bits(np.asarray(qt.tensor_scale_inv)) == ref.bits(r.tensor_scale_inv)
  got = np.asarray(qt.data).astype(np.float64)
  nan_in = np.isnan(x)
  if fmt.has_nan:
    assert np.all(np.isnan(got[nan_in]))
  else:
    assert np.all(got[nan_in] == 0) and not np.any(np.signbit(got[nan_in]))
  picked_hi = picked_lo = 0
  for pos in zip(*np.nonzero(~nan_in & ~r.unspecified)):
    v, p = float(r.scaled[pos]), float(got[pos])
    assert np.signbit(p) == np.signbit(v), (pos, v, p)
    if abs(v) >= fmt.max:
      assert abs(p) == fmt.max, (pos, v, p)
      continue
    lo, hi = ref.neighbours(v, fmt)
    assert abs(p) in (lo, hi), (pos, v, p, lo, hi)
    picked_hi += lo != hi and abs(p) == hi
    picked_lo += lo != hi and abs(p) == lo
  assert picked_hi > 50 and picked_lo > 50


@pytest.mark.parametrize("name", ["nvfp4_sr", "mxfp4_sr"])
def test_stochastic_rounding_is_deterministic_per_key(name):
  """Same key: same bits (jit, eager, every path); another key: other bits."""
  spec = _sr_specs()[name]
  x = jnp.asarray(_between_grid(64 * 64, np.random.default_rng(2)).reshape(64, 64))
  k1, k2 = jax.random.key(11), jax.random.key(12)
  a = np.asarray(_quantize_jit(x, spec, key=k1).data)
  b = np.asarray(fp8jax.quantize(x, spec, key=k1).data)  # eager: same bits
  c = np.asarray(_quantize_jit(x, spec, key=k2).data)
  assert np.array_equal(ref.bits(a), ref.bits(b))
  assert not np.array_equal(ref.bits(a), ref.bits(c))
  d = np.asarray(_quantize_jit(x, spec).data)  # key from the input's bits
  e = np.asarray(_quantize_jit(x, spec).data)
  assert np.array_equal(ref.bits(d), ref.bits(e))
  # One key, every path: the same bits.
  qdq = np.asarray(_QDQ_JIT["quantize_dequantize"](x, spec, key=k1))
  paths = {
      "fused": _QDQ_JIT["fused"](x, spec, key=k1),
      "fake_quant": _QDQ_JIT["fake_quant"](x, spec, key=k1),
      "dequantize(quantize)": _dequantize_jit(_quantize_jit(x, spec, key=k1), None),
  }
  for what, got in paths.items():
    assert not ref.mismatches(np.asarray(got), qdq), what


N_KEYS, TAU, N_ELEMENTS = 1000, 0.1, 64


@pytest.mark.parametrize("name", ["nvfp4_sr", "mxfp4_sr"])
def test_stochastic_rounding_is_unbiased(name):
  """Mean of x_hat over N = 1000 keys -> E[x_hat] (= x up to float32 rounding).

  Hoeffding: for one element, x_hat takes two values a gap g apart, so
  P(|mean - E| >= tau * g) <= 2 exp(-2 N tau**2) = 2 exp(-20) = 4.1e-9 with tau = 0.1.
  Union bound over the 64 elements: 2.6e-7 per test, 5.2e-7 for both tests < 1e-6.
  The keys and inputs are fixed, so the outcome is reproducible anyway. Scales are
  deterministic, so E[x_hat] = x_lo + P(hi) (x_hi - x_lo) with P(hi) = (|v| - lo) /
  (hi - lo), v = x * enc; nothing saturates (the first element of a block is its amax,
  the others are 2-90% of it), so that is x up to a few float32 roundings.
  """
  spec = _sr_specs()[name]
  fmt = ref.fmt_of(spec.format)
  n_block = spec.granularity.sizes[0]
  rng = np.random.default_rng(3)
  x = _between_grid(N_ELEMENTS, rng)
  x[::n_block] = np.float32(2.0 ** rng.integers(-3, 3, N_ELEMENTS // n_block))
  for b in range(N_ELEMENTS // n_block):
    x[b * n_block + 1:(b + 1) * n_block] *= x[b * n_block] * np.float32(0.9)
  r = ref.ref_for_spec(x, spec.replace(rounding="nearest"))
  keys = jax.random.split(jax.random.key(2024), N_KEYS)
  run = jax.jit(jax.vmap(lambda k: fp8jax.quantize_dequantize(jnp.asarray(x), spec, key=k)))
  samples = np.asarray(run(keys)).astype(np.float64)
  mean = samples.mean(axis=0)
  scale_inv = r.scale_inv.astype(np.float64).ravel()
  d = None if r.tensor_scale_inv is None else float(r.tensor_scale_inv)

  def x_hat(p, i):
    inv = scale_inv[i // n_block]
    return ref.f32(p * inv) if d is None else ref.f32(ref.f32(p * inv) * d)

  for i in range(N_ELEMENTS):
    v = float(r.scaled[i])
    assert abs(v) < fmt.max or i % n_block == 0
    if i % n_block == 0:
      continue
    lo, hi = ref.neighbours(v, fmt)
    a, b = x_hat(math.copysign(lo, v), i), x_hat(math.copysign(hi, v), i)
    assert set(samples[:, i].tolist()) <= {a, b}, i
    expect = a if lo == hi else a + (abs(v) - lo) / (hi - lo) * (b - a)
    assert abs(expect - x[i]) <= 1e-6 * abs(x[i]), (i, expect, x[i])
    assert abs(mean[i] - expect) <= TAU * abs(b - a), (i, mean[i], expect, a, b)
