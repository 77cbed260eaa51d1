"""Scales (fp8jax.numerics.scales) on hand-worked values: the OCP rule, non-finite and empty
blocks, two-level NVFP4 scales (per tensor, per row, UE5M3, a given tensor amax), block-scale
rounding and the elementwise round trip. The one-level rules against a reference:
``tests/numerics/test_formats_and_scales.py``; OAS: ``tests/numerics/test_oas.py``."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from fp8jax.numerics import formats, scales

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max
NVFP4 = fp8jax.preset("nvfp4")  # E2M1 (max 6), E4M3 block scales (max 448)


def _np(*arrays):
  return [np.asarray(a) for a in arrays]


_compute_scales = jax.jit(scales.compute_scales, static_argnames=("spec", "blocked"))


def _two_level(amax, spec, tensor_amax=None):
  """``compute_scales`` jitted (one compilation, not one per operation), as NumPy."""
  return _np(*_compute_scales(jnp.asarray(amax, jnp.float32), spec=spec,
                              tensor_amax=tensor_amax))


def test_round_pow2_clamps_to_normal_float32_and_refuses_an_unknown_rounding():
  v = jnp.asarray([0.75, 3.0, 0.0, 2.0**-130, np.inf, 2.0**127], jnp.float32)
  np.testing.assert_array_equal(scales.round_pow2(v, "floor"),
                                [0.5, 2, 2.0**-126, 2.0**-126, 2.0**126, 2.0**126])
  np.testing.assert_array_equal(scales.round_pow2(v, "ceil"),
                                [1, 4, 2.0**-126, 2.0**-126, 2.0**126, 2.0**126])
  with pytest.raises(ValueError, match=r"unknown power-of-two rounding 'nearest'"):
    scales.round_pow2(v, "nearest")


def test_the_ocp_rule_takes_the_exponent_of_amax_less_emax():
  """scale_inv = 2**(floor(log2 amax) - 8) in E4M3 (OCP MX): amax 500 gets 1 and saturates
  (500 > 448), where rceil takes the next power of two, 2."""
  amax = jnp.asarray([500.0, 100.0, 448.0, 3.0], jnp.float32)
  s, inv = _np(*scales.compute_scale(amax, fp8jax.QuantSpec(scale_format="pow2",
                                                            pow2_rounding="ocp")))
  np.testing.assert_array_equal(inv, [1, 2.0**-2, 1, 2.0**-7])
  np.testing.assert_array_equal(s, [1, 4, 1, 128])
  _, rceil = _np(*scales.compute_scale(amax, fp8jax.QuantSpec(scale_format="pow2",
                                                              pow2_rounding="rceil")))
  assert rceil[0] == 2 and list(rceil[1:]) == list(inv[1:])
  s, inv = _np(*scales.compute_scale(amax, fp8jax.QuantSpec(scale_format="pow2",
                                                            pow2_rounding="ocp", margin=1)))
  np.testing.assert_array_equal(inv, [2, 2.0**-1, 2, 2.0**-6])


def test_non_finite_blocks_get_a_nan_scale_inv_and_empty_blocks_scale_one():
  amax = jnp.asarray([np.nan, np.inf, 2.0, 0.0, 1e-40], jnp.float32)
  s, inv = _np(*scales.compute_scale(amax, fp8jax.QuantSpec(eps=0.0)))
  np.testing.assert_array_equal(s, [1, 1, 224, 1, 1])  # a subnormal amax counts as 0
  np.testing.assert_array_equal(inv, [np.nan, np.nan, F32(1) / F32(224), 1, 1])
  # eps raises an empty block's amax: scale 448 / 1e-12, computed in float32
  s, inv = _np(*scales.compute_scale(jnp.zeros(1), fp8jax.QuantSpec(eps=1e-12)))
  assert s[0] == F32(448) / F32(1e-12) and inv[0] == F32(1) / s[0]


def test_bad_arguments_are_refused_by_name():
  with pytest.raises(ValueError, match=r"two-level e4m3 scales need compute_scales \(a "
                                       r"per-tensor level too\)"):
    scales.compute_scale(jnp.ones(2), NVFP4)
  with pytest.raises(TypeError, match=r"compute_scale: amax must be a jax.Array or "
                                      r"numpy.ndarray, got list"):
    scales.compute_scale([1.0], fp8jax.QuantSpec())
  with pytest.raises(TypeError, match=r"compute_scales: spec must be a QuantSpec, got the "
                                      r"string 'nvfp4'; for a named preset pass "
                                      r"fp8jax.preset\('nvfp4'\)"):
    scales.compute_scales(jnp.ones(2), "nvfp4")


def test_two_level_scales_on_known_values():
  """G = 12 (the inf block skipped): S_enc = 448 * 6 / 12 = 224; block scales
  e4m3(amax * 224 / 6): 448, 112, 0; s = 1 / (sd * (1/224)): 0.5, 2, FLT_MAX for the empty
  block; the inf block: s 1, scale_inv NaN."""
  s, inv, level = _two_level([12.0, 3.0, 0.0, np.inf], NVFP4)
  np.testing.assert_array_equal(inv, [448, 112, 0, np.nan])
  np.testing.assert_array_equal(s, [0.5, 2, FLT_MAX, 1])
  assert level == F32(1) / F32(224)
  # The tensor's amax given (a kernel's tile): 24, so S_enc = 112, block scales 224 and 56.
  s, inv, level = _two_level([12.0, 3.0], NVFP4, jnp.float32(24.0))
  np.testing.assert_array_equal(inv, [224, 56])
  np.testing.assert_array_equal(s, [0.5, 2])
  assert level == F32(1) / F32(112)
  s, inv, level = _two_level(np.zeros(3), NVFP4)  # an all-zero tensor
  assert level == 1 and not inv.any() and (s == FLT_MAX).all()


def test_ue5m3_block_scales_replace_448_by_114688():
  """S_enc = 114688 * 6 / 12 = 57344; block scales 12 * 57344 / 6 = 114688 and 28672."""
  s, inv, level = _two_level([12.0, 3.0, 0.0], fp8jax.preset("nvfp4_ue5m3"))
  np.testing.assert_array_equal(inv, [114688, 28672, 0])
  np.testing.assert_array_equal(s, [0.5, 2, FLT_MAX])
  assert level == F32(1) / F32(57344)


def test_row_scaled_levels_are_taken_per_row():
  """Rows of the block grid [3, 2]: G = 12, 0.5 (its NaN block skipped), 0. Row 1:
  S_enc = 2688 / 0.5 = 5376, its block scale 0.5 * 5376 / 6 = 448 and s = 5376 / 448 = 12."""
  spec = fp8jax.preset("nvfp4_row_scaled")
  amax = jnp.asarray([[12.0, 3.0], [0.5, np.nan], [0.0, 0.0]], jnp.float32)
  np.testing.assert_array_equal(scales.level_amax(amax, spec), [[12], [0.5], [0]])
  assert scales.level_amax(amax, NVFP4) == 12  # per tensor
  blocked = amax[:, None, :, None]  # [n0, 1, n1, 1]: the blocked layout
  np.testing.assert_array_equal(scales.level_amax(blocked, spec, blocked=True),
                                np.array([12, 0.5, 0], np.float32).reshape(3, 1, 1, 1))
  s, inv, level = _two_level(amax, spec)
  np.testing.assert_array_equal(level, [[F32(1) / F32(224)], [F32(1) / F32(5376)], [1]])
  np.testing.assert_array_equal(inv, [[448, 112], [448, np.nan], [0, 0]])
  np.testing.assert_array_equal(s, [[0.5, 2], [12, 1], [FLT_MAX, FLT_MAX]])


def test_block_scales_round_to_their_format():
  v = np.array([0.3, 17.0, 448.0, 100.7, 0.001], np.float32)
  e4m3 = v.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
  np.testing.assert_array_equal(e4m3, [0.3125, 16, 448, 104, 2.0**-9])
  np.testing.assert_array_equal(scales.round_block_scales(jnp.asarray(v), NVFP4), e4m3)
  ue5m3 = fp8jax.preset("nvfp4_ue5m3")
  # UE5M3 has E4M3's 3 mantissa bits and normal values down to 2**-14: 0.001 -> 2**-10
  np.testing.assert_array_equal(scales.round_block_scales(jnp.asarray(v), ue5m3),
                                [0.3125, 16, 448, 104, 2.0**-10])
  assert (scales.block_scale_max(NVFP4), scales.block_scale_min_normal(NVFP4)) == (448, 2**-6)
  assert scales.block_scale_min_normal(ue5m3) == 2**-14


def test_apply_scales_rounds_scales_and_clips_to_the_output_dtype():
  """E4M3: 1.3 -> 1.25, -700 -> -448 (saturated), 300 -> 288; times 1000, clipped to
  float16's 65504 instead of overflowing; NaN kept."""
  e4m3 = formats.get_format("e4m3")
  x = jnp.asarray([1.3, -700.0, np.nan, 2.0, 300.0], jnp.float32)
  one = jnp.float32(1.0)
  out = scales.apply_scales(x, one, jnp.float32(1000.0), e4m3, jnp.float16)
  assert out.dtype == jnp.float16
  np.testing.assert_array_equal(np.asarray(out, np.float32), [1250, -65504, np.nan, 2000, 65504])
  # scaled by s = 2 first (2.6 -> 2.5), then by both levels of two-level scales
  out = scales.apply_scales(x[:1], jnp.float32(2.0), jnp.float32(0.5), e4m3, jnp.float32,
                            tensor_scale_inv=jnp.float32(4.0))
  np.testing.assert_array_equal(out, [5.0])


def test_apply_scales_rounds_stochastically_with_bits():
  """1.3 lies 0.4 of the way from 1.25 to 1.375: a 24-bit draw u rounds up when u < 0.4."""
  e4m3 = formats.get_format("e4m3")
  x, one = jnp.asarray([1.3, 1.3], jnp.float32), jnp.float32(1.0)
  bits = jnp.asarray([0, 0xFFFFFFFF], jnp.uint32)
  np.testing.assert_array_equal(scales.apply_scales(x, one, one, e4m3, jnp.float32, bits=bits),
                                [1.375, 1.25])
  np.testing.assert_array_equal(scales.apply_scales(x, one, one, e4m3, jnp.float32), [1.25, 1.25])
