"""Formats, the saturating cast, and scale rules against independent references."""

from hypothesis import example, given
from hypothesis import strategies as st
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from tests.references import reference as ref

f32_values = st.floats(width=32, allow_nan=True, allow_infinity=True)


@pytest.mark.parametrize("fmt", sorted(ref.FP8_DTYPES))
@given(values=st.lists(f32_values, min_size=1, max_size=64))
def test_saturating_cast_matches_clip_then_ml_dtypes(fmt, values):
  x = ref.flush(np.array(values, np.float32))
  got = np.asarray(fp8jax.saturating_cast(jnp.asarray(x), fp8jax.get_format(fmt)))
  fmax = np.float32(ref.FP8_MAX[fmt])
  expected = np.clip(x, -fmax, fmax).astype(ref.FP8_DTYPES[fmt])
  assert ref.same_bits(got, expected)


def test_cast_edges_from_the_reference_sheet():
  e4m3, e5m2 = fp8jax.get_format("e4m3"), fp8jax.get_format("e5m2")
  x = jnp.asarray([464.0, 465.0, np.inf, -np.inf, np.nan], jnp.float32)
  got = np.asarray(fp8jax.saturating_cast(x, e4m3)).astype(np.float32)
  np.testing.assert_array_equal(got[:4], [448, 448, 448, -448])
  assert np.isnan(got[4])
  y = jnp.asarray([61439.0, 61440.0, np.inf], jnp.float32)
  got = np.asarray(fp8jax.saturating_cast(y, e5m2)).astype(np.float32)
  np.testing.assert_array_equal(got, [57344, 57344, 57344])


def test_format_facts_and_names():
  assert fp8jax.get_format("float8_e4m3fn") is fp8jax.get_format("e4m3")
  e4 = fp8jax.get_format("e4m3")
  assert (e4.max, e4.min_normal, e4.min_subnormal, e4.emax) == (448, 2**-6, 2**-9, 8)
  e5 = fp8jax.get_format("E5M2")
  assert (e5.max, e5.min_normal, e5.min_subnormal, e5.emax) == (57344, 2**-14, 2**-16, 15)
  assert fp8jax.get_format("e4m3fnuz").max == 240
  with pytest.raises(ValueError, match="unknown FP8 format 'e3m4'.*known formats"):
    fp8jax.get_format("e3m4")


@given(st.floats(width=32, min_value=0.0, allow_nan=False, allow_infinity=True),
       st.sampled_from(["floor", "ceil"]))
def test_round_pow2_matches_frexp_reference(v, rounding):
  got = np.asarray(fp8jax.round_pow2(jnp.float32(v), rounding))
  assert got == ref.ref_pow2(v, rounding)


def test_round_pow2_is_not_round_to_nearest():
  v = jnp.asarray([2.9, 3.0, 4.0, 5.0], jnp.float32)
  np.testing.assert_array_equal(fp8jax.round_pow2(v, "floor"), [2, 2, 4, 4])
  np.testing.assert_array_equal(fp8jax.round_pow2(v, "ceil"), [4, 4, 4, 8])
  # ml_dtypes' E8M0 cast rounds to nearest (2.9 -> 2, 3 -> 4): a different rule.
  e8m0 = np.asarray(v).astype(ml_dtypes.float8_e8m0fnu).astype(np.float32)
  np.testing.assert_array_equal(e8m0, [2, 4, 4, 4])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale_format,rounding",
                         [("fp32", "floor"), ("pow2", "floor"), ("pow2", "ceil"),
                          ("pow2", "rceil")])
@given(amax=st.floats(width=32, min_value=0.0, allow_nan=False, allow_infinity=False),
       eps=st.sampled_from([0.0, 1e-12, 1e-4]), margin=st.integers(-3, 3))
# rceil, e5m2: amax / 57344 is below 2**-126 and flushed on XLA:CPU, which lost the margin
# (2**-126 instead of the smallest power of two >= amax * 2 / 57344, 2**-125).
@example(amax=4.626502859949186e-34, eps=0.0, margin=1)
def test_compute_scale_matches_reference(fmt, scale_format, rounding, amax, eps, margin):
  rounding = rounding if scale_format == "pow2" else None
  spec = fp8jax.QuantSpec(format=fmt, scale_format=scale_format, pow2_rounding=rounding,
                          eps=eps, margin=margin)
  s, inv = fp8jax.compute_scale(jnp.float32(amax), spec)
  amax = float(ref.flush(np.float32(amax)))
  rs, rinv = ref.ref_scale(amax, fmt, eps, margin, scale_format, rounding)
  assert (np.float32(s), np.float32(inv)) == (rs, rinv)
  assert np.isfinite(s) and np.isfinite(inv) and s > 0


def test_pow2_rules_on_known_values():
  # amax 3.0 in E4M3: s = 448/3 = 149.33, scale_inv = 3/448 = 0.0066964 (2**-7.22)
  def scales(rounding):
    spec = fp8jax.QuantSpec(scale_format="pow2", pow2_rounding=rounding)
    s, inv = fp8jax.compute_scale(jnp.float32(3.0), spec)
    return float(s), float(inv)
  assert scales("floor") == (128.0, 2**-7)  # no saturation
  assert scales("ceil") == (256.0, 2**-8)  # 3 * 256 = 768 > 448: saturates
  assert scales("rceil") == (128.0, 2**-7)  # DeepGEMM: ceil(3/448) = 2**-7
