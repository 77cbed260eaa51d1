"""MX (OCP Microscaling v1.0) and NVFP4 formats against the independent reference.

The reference (``tests/references/reference_mx.py``) is written from the contract and the OCP MX
v1.0 specification only. Payloads, scales and dequantized values are compared bit for
bit, on hypothesis inputs, edge cases and inputs at rounding boundaries. The element
formats against the spec: ``tests/numerics/test_mx_spec.py``; the rounding paths and stochastic
rounding: ``tests/numerics/test_mx_rounding.py``.
"""

from hypothesis import given, settings
from hypothesis import strategies as st
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from tests.references import reference_mx as ref
from tests.references.mx_cases import (
  DTYPES,
  FEW,
  FORMAT_NAMES,
  MANY,
  MX_PRESETS,
  NV_PRESETS,
  all_values,
  check_quantize,
  dequantize_jit,
  mx_arrays,
  quantize_jit,
)

# ---------------------------------------------------------------------------------------
# bit-exact payloads and scales against the reference


def _preset_case(name, x, jit=True):
  spec = fp8jax.preset(name)
  if spec.granularity.kind == "block" and x.ndim < 2:
    x = x.reshape(1, -1)
  check_quantize(x, spec, jit)


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
  check_quantize(x, spec)


@pytest.mark.slow
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
  r = check_quantize(x, spec)
  qt = quantize_jit(jnp.asarray(x), spec)
  deq = np.asarray(dequantize_jit(qt, None))
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
      check_quantize(x, spec, jit)
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
  grid = np.unique(np.abs(all_values(fmt.dtype)[np.isfinite(all_values(fmt.dtype))]))
  targets = np.concatenate([grid[1:], (grid[:-1] + grid[1:]) / 2])
  targets = targets[targets < fmt.max * 0.8]
  g = np.float32(2.0 ** rng.uniform(-20, 20))
  amax = (g * np.exp2(-rng.uniform(0, 18, rows))).astype(np.float32)
  if spec.scale_format == "e4m3":  # half the block amaxes put d = amax * m on E4M3 ties
    s_enc, _ = ref.nvfp4_tensor_scale(float(g), fmt, spec.eps)
    m = ref.f32(s_enc * ref.f32(1.0 / fmt.max))
    e4m3 = np.unique(np.abs(all_values(ml_dtypes.float8_e4m3fn)))
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
    check_quantize(_boundary_input(spec, seed), spec)


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
  qt = quantize_jit(jnp.asarray(x), spec)
  got = np.asarray(qt.scale_inv).astype(np.float64)[:, 0]
  n = len(amax) // 2
  for a, s, s_up in zip(amax[:n], got[:n], got[n:]):
    if a < 2.0**-126:
      assert s == s_up == 1.0, (a, s, s_up)
      continue
    k = ref.floor_log2(float(a) / float(fmax))
    assert s == 2.0 ** min(max(k, -126), 126), (a, s)
    assert s_up == 2.0 ** min(max(k + 1, -126), 126), (a, s_up)
  check_quantize(x, spec)


def test_nvfp4_zero_block_scale_next_to_huge_block():
  """A block far below the tensor amax gets sd = 0 and dequantizes to zeros."""
  x = np.ones((1, 32), np.float32)
  x[0, :16] *= 1e20
  x[0, 16:] = np.linspace(1, 2, 16) * 1e-3
  r = check_quantize(x, fp8jax.preset("nvfp4"))
  assert r.scale_inv.astype(np.float32)[0, 1] == 0
  assert np.all(r.deq[0, 16:] == 0)
