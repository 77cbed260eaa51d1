"""Stochastic rounding from 8 random bits (Blackwell's ``cvt.rs`` and Transformer Engine's
software fallback) against a per-element NumPy reference given the same bits, and its
bias against the analytic expectation and against the 24-bit rounding.

The reference follows the rule as stated by TE's ``stochastic_round_fp4_e2m1``
(``transformer_engine/common/util/ptx.cuh``): ``r = rbits & 0xFF``,
``t = fmaf(r / 256, step(|x|), |x|)``, ``floor(t / step(t)) * step(t)``, at most max,
with the sign of x. It works on exact rationals and rounds ``t`` to float32 once.
"""

from fractions import Fraction
import math

from hypothesis import given
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import recipes
from fp8jax.numerics import formats
from tests.references import reference_mx as ref

FORMATS = ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2"]
N = 64  # elements per example (one compiled shape)


def _step(a: float, fmt) -> Fraction:
  """Grid spacing of fmt at the non-negative value a (exact)."""
  emin = round(math.log2(fmt.min_normal))
  e = math.frexp(a)[1] - 1 if a > 0 else emin
  return Fraction(2) ** (max(e, emin) - fmt.mantissa_bits)


def _to_float32(q: Fraction) -> float:
  """q rounded to the nearest float32, ties to even (q below 2**100)."""
  c = np.float32(float(q))
  cands = [np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))]
  return float(min(cands, key=lambda v: (abs(Fraction(float(v)) - q),
                                         int(np.array(v).view(np.uint32)) & 1)))


def sr8_reference(x: np.ndarray, r: np.ndarray, name: str) -> np.ndarray:
  fmt = formats.get_format(name)
  out = np.empty(x.shape, np.float64)
  for i, (v, bits) in enumerate(zip(x.ravel().tolist(), r.ravel().tolist())):
    if math.isnan(v):
      out.flat[i] = math.nan
      continue
    if math.isinf(v):
      out.flat[i] = math.copysign(fmt.max, v)
      continue
    a = abs(v)
    t = _to_float32(Fraction(a) + Fraction(bits & 0xFF, 256) * _step(a, fmt))
    st_ = _step(t, fmt)
    mag = min(math.floor(Fraction(t) / st_) * st_, Fraction(fmt.max))
    out.flat[i] = math.copysign(float(mag), v)
  return out


_sr = jax.jit(formats.stochastic_round_to_format, static_argnums=(1, 3))


def _run(x, name, bits, sr_bits=8):
  return np.asarray(_sr(jnp.asarray(x), formats.get_format(name), jnp.asarray(bits), sr_bits),
                    np.float64)


def _same(got, want):
  """Equal values, NaN where NaN, and the same sign of zero."""
  return (np.array_equal(got, want, equal_nan=True)
          and np.array_equal(np.signbit(got), np.signbit(want)))


@st.composite
def scaled_values(draw, name):
  """N float32 values across fmt's range: subnormals, normals, past max, grid points,
  midpoints, zeros of both signs, ±inf and NaN."""
  fmt = formats.get_format(name)
  emin = round(math.log2(fmt.min_normal))
  seed = draw(st.integers(0, 2**32 - 1))
  rng = np.random.default_rng(seed)
  e = rng.integers(emin - fmt.mantissa_bits - 4, fmt.emax + 3, N)
  x = rng.uniform(1.0, 2.0, N) * 2.0 ** e
  k = rng.integers(0, N, 12)
  x[k[:6]] = ref.round_array(x[k[:6]], ref.fmt_of(name))  # grid values
  x[k[6:9]] = np.float32(fmt.min_subnormal) * rng.integers(1, 4, 3) / 2  # ties at the bottom
  x = (x * rng.choice([-1.0, 1.0], N)).astype(np.float32)
  specials = draw(st.lists(st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan]),
                           max_size=4))
  x[N - len(specials):] = np.asarray(specials, np.float32)
  bits = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32)
  return x, bits


@pytest.mark.parametrize("name", FORMATS)
@given(data=st.data())
def test_sr8_matches_the_per_element_reference(name, data):
  x, bits = data.draw(scaled_values(name))
  assert _same(_run(x, name, bits), sr8_reference(x, bits, name))


def test_sr8_edge_cases():
  """The float32 rounding of t (as TE's fmaf), the 8 bits taken from the low byte, and
  saturation."""
  x = np.asarray([2.0**-9 - 2.0**-30, 2.0**-9 - 2.0**-30, 0.75, 0.75, 5.0, 5.0, -5.9, 7.0,
                  -0.0, 1.0], np.float32)
  r = np.asarray([255, 254, 127, 128, 127, 128, 0xFFFFFF00 | 255, 255, 255, 0xFFFFFF00],
                 np.uint32)
  got = _run(x, "e2m1", r)
  # t = 0.5 - 2**-30 rounds to 0.5 in float32: 0.5 (exact arithmetic would give 0);
  # r = 254 leaves t = 0.498..: 0. 0.75 + r/256 * 0.5 reaches 1.0 at r = 128; 5 + r/128
  # reaches 6 at r = 128; -5.9 with r = 255 passes 6 and saturates to -6 (the high bits are
  # ignored); 7 saturates; -0 stays -0; a grid value is kept whatever the bits.
  want = [0.5, 0.0, 0.5, 1.0, 4.0, 6.0, -6.0, 6.0, -0.0, 1.0]
  assert _same(got, np.asarray(want)), got
  assert _same(got, sr8_reference(x, r, "e2m1"))


def _bias(fmt, v):
  """(step, f): the grid step at v > 0 and v's fraction of it above the grid value below."""
  step = ref.grid_ulp(float(v), ref.fmt_of(fmt))
  return step, float(v) / step - math.floor(float(v) / step)


def test_sr8_expectation_over_all_256_bit_patterns():
  """E over the 256 values of r: x + step * (floor(256 f) / 256 - f), exactly (values at or
  above the smallest normal, where t is exact in float32)."""
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.uniform(1.0, 6.0, 48), [1.0, 1.5, 2.5, 3.5, 4.0 + 2.0**-20,
                                                  5.999999]]).astype(np.float32)
  r = np.arange(256, dtype=np.uint32)
  runs = np.stack([_run(x, "e2m1", np.full(x.shape, b, np.uint32)) for b in r])
  for i, v in enumerate(x.astype(np.float64)):
    step, f = _bias("e2m1", v)
    want = v + step * (math.floor(256 * f) / 256 - f)
    assert abs(runs[:, i].mean() - want) <= 1e-12 * v, (v, runs[:, i].mean(), want)


def test_sr8_bias_is_analytic_and_differs_from_24_bits():
  """Sampled: 2**18 draws over a grid of values whose fraction f of a step is
  (j + 0.75) / 256, j < 4. The 8-bit rounding's mean error, in steps, is
  floor(256 f) / 256 - f = -0.75/256 (rounding toward zero is favoured), the 24-bit
  rounding's ceil(2**24 f) / 2**24 - f = 0; each is met within 5 standard errors (about
  2e-4 of a step), and the two differ by more than 10 of them."""
  reps = 2**12
  rng = np.random.default_rng(1)
  j = rng.integers(0, 4, 64)
  lo = rng.choice([0.5, 1.0, 1.5, 2.0, 3.0, 4.0], 64)
  step = np.where(lo >= 4.0, 2.0, np.where(lo >= 2.0, 1.0, 0.5))
  sign = rng.choice([-1.0, 1.0], 64)
  x = np.tile((sign * (lo + step * (j + 0.75) / 256)).astype(np.float32), reps)
  f = np.tile((j + 0.75) / 256, reps)
  unit = np.tile(sign * step, reps)  # one step, toward larger |x|
  bits = jax.random.bits(jax.random.key(9), x.shape, jnp.uint32)
  means = {}
  for sr_bits, expect in ((8, np.floor(256 * f) / 256 - f),
                          (24, np.ceil(2.0**24 * f) / 2.0**24 - f)):
    err = (_run(x, "e2m1", bits, sr_bits) - x.astype(np.float64)) / unit
    p = f + expect  # probability of rounding up
    se = math.sqrt(np.mean(p * (1 - p)) / x.size)
    means[sr_bits] = err.mean()
    assert abs(err.mean() - expect.mean()) < 5 * se, (sr_bits, err.mean(), expect.mean(), se)
  assert abs(np.mean(np.floor(256 * f) / 256 - f) + 0.75 / 256) < 1e-12
  assert means[24] - means[8] > 10 * se


def test_presets_and_recipe_use_8_bits():
  assert fp8jax.preset("nvfp4_sr").sr_bits == 8
  assert fp8jax.preset("nvfp4_sr").backward.sr_bits == 8
  grad = recipes.recipe("nvfp4_recipe").roles.grad
  assert (grad.rounding, grad.sr_bits) == ("stochastic", 8)
  assert fp8jax.QuantSpec().sr_bits == 24
  assert fp8jax.preset("nvfp4_sr").describe().endswith("sr8")
  with pytest.raises(ValueError, match="sr_bits"):
    fp8jax.QuantSpec(rounding="stochastic", sr_bits=16)


def _spec(sr_bits):
  return fp8jax.preset("nvfp4_sr").replace(backward=None, sr_bits=sr_bits)


_X = np.random.default_rng(2).standard_normal((2, 32)).astype(np.float32)


@pytest.mark.parametrize("sr_bits", [8, 24])
def test_quantize_uses_the_spec_bits(sr_bits):
  """quantize rounds the scaled values exactly as stochastic_round_to_format does with the
  spec's sr_bits and the key's bits."""
  spec, key = _spec(sr_bits), jax.random.key(3)
  data = jax.jit(lambda x, k: fp8jax.quantize(x, spec, key=k).data)(jnp.asarray(_X), key)
  r = ref.ref_for_spec(_X, spec.replace(rounding="nearest"))
  bits = np.asarray(jax.random.bits(key, _X.shape, jnp.uint32))
  want = _run(r.scaled.astype(np.float32), "e2m1", bits, sr_bits)
  assert _same(np.asarray(data).astype(np.float64), want)


def test_fused_round_trip_uses_the_spec_bits():
  """The fused round trip equals dequantize(quantize) with 8 bits too."""
  spec, key = _spec(8), jax.random.key(3)
  x = jnp.asarray(_X)
  qdq, deq = jax.jit(lambda x, k: (
      fp8jax.quantize_dequantize(x, spec, key=k),
      fp8jax.dequantize(fp8jax.quantize(x, spec, key=k), jnp.float32)))(x, key)
  np.testing.assert_array_equal(np.asarray(qdq), np.asarray(deq))
