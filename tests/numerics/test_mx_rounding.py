"""MX and NVFP4 rounding paths: quantize_dequantize, the fused kernel and fake_quant agree
bit for bit; the OCP scale rule saturates where the round-up rule does not; stochastic
rounding picks a grid neighbour, is deterministic per key, and is unbiased.
"""

import math

from hypothesis import given
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from tests.references import reference_mx as ref
from tests.references.mx_cases import (
  FEW,
  MANY,
  MX_PRESETS,
  NV_PRESETS,
  QDQ_JIT,
  QDQ_PATHS,
  check_quantize,
  dequantize_jit,
  mx_arrays,
  quantize_jit,
)

# ---------------------------------------------------------------------------------------
# quantize_dequantize == fused == fake_quant forward


def _qdq_case(name, x, jit=True):
  spec = fp8jax.preset(name)
  if spec.granularity.kind == "block" and x.ndim < 2:
    x = x.reshape(1, -1)
  want = ref.ref_for_spec(x, spec).deq
  xj = jnp.asarray(x)
  outs = {k: f(xj, spec) for k, f in (QDQ_JIT if jit else QDQ_PATHS).items()}
  for what, got in outs.items():
    errs = ref.mismatches(np.asarray(got), want)
    assert not errs, f"{what} {spec.describe()} {x.dtype}{x.shape}\n" + "\n".join(errs)


@pytest.mark.slow
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
# the OCP rule saturates one binade; the round-up rule does not


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
    check_quantize(x, fp8jax.preset(name), jit=False)


# ---------------------------------------------------------------------------------------
# stochastic rounding


def _sr_specs():
  sr = dict(rounding="stochastic")
  return {"nvfp4_sr": fp8jax.preset("nvfp4_sr"),  # 8 random bits per element
          "nvfp4_sr24": fp8jax.preset("nvfp4_sr").replace(sr_bits=24),
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
  qt = quantize_jit(jnp.asarray(x), spec, key=jax.random.key(7))
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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nvfp4_sr", "mxfp4_sr"])
def test_stochastic_rounding_is_deterministic_per_key(name):
  """Same key: same bits (jit, eager, every path); another key: other bits."""
  spec = _sr_specs()[name]
  x = jnp.asarray(_between_grid(64 * 64, np.random.default_rng(2)).reshape(64, 64))
  k1, k2 = jax.random.key(11), jax.random.key(12)
  a = np.asarray(quantize_jit(x, spec, key=k1).data)
  b = np.asarray(fp8jax.quantize(x, spec, key=k1).data)  # eager: same bits
  c = np.asarray(quantize_jit(x, spec, key=k2).data)
  assert np.array_equal(ref.bits(a), ref.bits(b))
  assert not np.array_equal(ref.bits(a), ref.bits(c))
  d = np.asarray(quantize_jit(x, spec).data)  # key from the input's bits
  e = np.asarray(quantize_jit(x, spec).data)
  assert np.array_equal(ref.bits(d), ref.bits(e))
  # One key, every path: the same bits.
  qdq = np.asarray(QDQ_JIT["quantize_dequantize"](x, spec, key=k1))
  paths = {
      "fused": QDQ_JIT["fused"](x, spec, key=k1),
      "fake_quant": QDQ_JIT["fake_quant"](x, spec, key=k1),
      "dequantize(quantize)": dequantize_jit(quantize_jit(x, spec, key=k1), None),
  }
  for what, got in paths.items():
    assert not ref.mismatches(np.asarray(got), qdq), what


N_KEYS, TAU, N_ELEMENTS = 1000, 0.1, 64


@pytest.mark.parametrize("name", ["nvfp4_sr24", "mxfp4_sr"])
def test_stochastic_rounding_is_unbiased(name):
  """Mean of x_hat over N = 1000 keys -> E[x_hat] (= x up to float32 rounding), with 24
  random bits per element (the 8-bit rounding's bias: ``tests/quant/test_rounding_bits.py``).

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
