"""UE5M3 block scales (fp8jax/numerics/ue5m3.py, ``QuantSpec(scale_format="ue5m3")``)
against the code-table reference of tests/references/reference_te2026.py: the rounding on
every code, every midpoint and its float32 neighbours, the two-level NVFP4 quantizer with
UE5M3 scales bit for bit, its spec errors and its recipe. Transformer Engine's own C++
reference with CUDA's conversion is checked in tests/references/test_te_nvfp4_bits.py."""

from hypothesis import given, settings
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.numerics import scales, ue5m3
from tests import strategies as hs
from tests.references import reference_te2026 as ref

SPEC = fp8jax.preset("nvfp4_ue5m3").replace(backward=None)


def _probes() -> np.ndarray:
  """Every code's value, every midpoint between neighbours and the float32 values one ulp
  either side of each, and values past the top."""
  t = ref.UE5M3_TABLE.astype(np.float32)
  mid = ((ref.UE5M3_TABLE[1:] + ref.UE5M3_TABLE[:-1]) / 2).astype(np.float32)
  near = np.concatenate([np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(1e9))])
  top = np.array([118784.0, 118784.01, 122880.0, 3e38, np.inf], np.float32)
  return np.concatenate([t, mid, near, top, np.float32(2.0**-18) * np.arange(4, dtype=np.float32)])


def test_code_table_matches_the_cuda_definition():
  values = np.asarray(ue5m3.decode(jnp.arange(256, dtype=jnp.uint8)))
  np.testing.assert_array_equal(values[:255], ref.UE5M3_TABLE.astype(np.float32))
  assert np.isnan(values[255])
  assert (ue5m3.MAX, ue5m3.MIN_SUBNORMAL, ue5m3.MIN_NORMAL) == (114688.0, 2.0**-17, 2.0**-14)
  assert values[1] == 2.0**-17 and values[8] == 2.0**-14 and values[0x78] == 1.0


def test_rounding_is_nearest_even_and_saturating_on_every_code_and_midpoint():
  probes = _probes()
  got = np.asarray(ue5m3.round_to_ue5m3(jnp.asarray(probes)))
  codes = np.asarray(ue5m3.encode(jnp.asarray(probes)))
  want = [ref.ue5m3_round(float(v)) for v in probes]
  np.testing.assert_array_equal(got, np.array([w[0] for w in want], np.float32))
  np.testing.assert_array_equal(codes, np.array([w[1] for w in want], np.uint8))


def test_nan_gives_ff_and_the_sign_is_dropped_as_cuda_does():
  codes = np.asarray(ue5m3.encode(jnp.asarray([np.nan, -2.0, -0.0, -np.inf], jnp.float32)))
  np.testing.assert_array_equal(codes, [0xFF, 0x80, 0x00, 0xFE])


@settings(max_examples=200, deadline=None)
@given(v=st.floats(0, 2e5, width=32))
def test_rounding_of_any_float32_matches_the_table(v):
  got = float(ue5m3.round_to_ue5m3(jnp.float32(v)))
  want = ref.ue5m3_round(float(np.float32(v)))[0]
  if v < np.finfo(np.float32).tiny:  # XLA:CPU flushes float32 subnormal inputs to 0
    want = 0.0
  assert got == want


_quantize = jax.jit(lambda x: (lambda q: (q.data.astype(jnp.float32), q.scale_inv,
                                          q.tensor_scale_inv, fp8jax.dequantize(q, jnp.float32)))(
                                              fp8jax.quantize(x, SPEC)))


@settings(max_examples=hs.examples(4, 30), deadline=None)
@given(x=hnp.arrays(np.float32, st.sampled_from([(4, 48), (3, 40)]),
                    elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=False)),
       spread=st.integers(0, 60))
def test_quantize_matches_the_reference_bit_for_bit(x, spread):
  """UE5M3 two-level NVFP4, rows spread over ``spread`` binades (subnormal UE5M3 scales
  and scales that round to 0 included)."""
  x = (x * np.float32(2.0) ** -np.linspace(0, spread, x.shape[0], dtype=np.float32)[:, None])
  x = x.astype(np.float32)
  q, s, level, deq = (np.asarray(v) for v in _quantize(jnp.asarray(x)))
  pay, want_s, want_level, want_deq = ref.two_level(x, scale_format="ue5m3")
  np.testing.assert_array_equal(q, pay.astype(np.float32))
  np.testing.assert_array_equal(s, want_s.astype(np.float32))
  assert np.float32(level) == np.float32(want_level)
  np.testing.assert_array_equal(deq, want_deq.astype(np.float32))


def test_tensor_level_maps_the_amax_to_6_times_114688():
  x = jnp.asarray([[1.5, -3.0] + [0.0] * 14], jnp.float32)
  _, s, level, _ = _quantize(x)
  assert float(level) == np.float32(1) / np.float32(6 * 114688 / 3.0)
  assert float(s[0, 0]) == 114688.0  # the block holding G gets the largest scale
  assert scales.block_scale_max(SPEC) == 114688.0


@pytest.mark.parametrize("bad, match", [
    (dict(format="e4m3"), "4-bit element format"),
    (dict(four_over_six="mae"), "scale_format='e4m3'"),
    (dict(rounding="ms_eden"), "rounding='ms_eden'"),
    (dict(scaling="delayed", granularity=fp8jax.per_tensor()), "need current scaling"),
    (dict(margin=1), "take no margin"),
])
def test_spec_refuses_what_ue5m3_cannot_do(bad, match):
  with pytest.raises(ValueError, match=match):
    SPEC.replace(**bad)


def test_recipe_changes_only_the_block_scales():
  base, cfg = fp8jax.recipe("nvfp4_recipe"), fp8jax.recipe("nvfp4_ue5m3")
  for role in ("input", "weight", "grad"):
    got = getattr(cfg.roles, role)
    assert got.scale_format == "ue5m3"
    assert got.replace(scale_format="e4m3") == getattr(base.roles, role)
  assert cfg.replace(roles=base.roles) == base
  assert SPEC.describe() == "e2m1 1x16@-1 current ue5m3+fp32"


@pytest.mark.parametrize("scale_format, tiny", [("e4m3", 2.0**-6), ("ue5m3", 2.0**-14)])
def test_operand_telemetry_counts_subnormal_and_zero_block_scales(scale_format, tiny):
  """``scale_subnormal_frac`` and ``scale_zero_frac`` against the reference's block scales:
  rows 4 binades apart, so that E4M3's 18 binades run out long before UE5M3's 34."""
  from fp8jax.gemm import operand_telemetry as ot

  rng = np.random.default_rng(8)
  x = (rng.standard_normal((16, 32)) * 2.0 ** -(4.0 * np.arange(16))[:, None]).astype(
      np.float32)
  x[0, :16] = 0.0  # an all-zero block counts in neither
  spec = SPEC.replace(scale_format=scale_format)
  sums = jax.jit(lambda v: ot.operand_sums(v, spec))(jnp.asarray(x))
  _, sd, _, _ = ref.two_level(x, scale_format=scale_format)
  live = np.abs(x).reshape(16, 2, 16).max(-1) > 0
  assert float(sums["scale_subnormal_blocks"]) == np.sum(live & (sd > 0) & (sd < tiny)) > 0
  assert float(sums["scale_zero_blocks"]) == np.sum(live & (sd == 0)) > 0
  stats = ot.summarize(sums)
  assert float(stats["scale_zero_frac"]) == np.sum(live & (sd == 0)) / 32
  plain = ot.operand_sums(jnp.asarray(x), fp8jax.preset("mxfp4"))
  assert float(plain["scale_subnormal_blocks"]) == float(plain["scale_zero_blocks"]) == 0
