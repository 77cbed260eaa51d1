"""fp8jax against the anchors' conventions, one test per row of the conformance table in
``docs/formats.md``: where fp8jax follows a rule, it matches an independent reference of
that rule bit for bit; where it departs, the test shows the difference the table states.

References: ``tests/references/reference_peers.py`` (OCP MX v1.0 with its reference library's
conventions, torchao's NVFP4 block scales) and ``tests/references/reference_mx.py`` (fp8jax's
contract, with Transformer Engine's NVFP4 order of operations).
"""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from tests.references import reference_mx as ref
from tests.references import reference_peers as peers

OCP_RULE = ["mxfp8_ocp", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]
ROUND_UP = ["mxfp8", "mxfp8_e5m2", "mxfp4_rceil"]


def _qdq(x, spec):
  qt = fp8jax.quantize(jnp.asarray(x), spec)
  return qt, np.asarray(fp8jax.dequantize(qt))


def _tiny_block(amax, n=32, seed=0):
  """``n`` float32 values of random signs and sizes whose largest magnitude is ``amax``."""
  x = np.random.default_rng(seed).uniform(-1, 1, n)
  x[3] = 1.0
  return (x * amax).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name", OCP_RULE + ROUND_UP)
def test_mx_presets_quantize_a_block_of_amax_1e_20_as_ocp_mx(name):
  """The MX presets take no eps: a block of amax 1e-20 gets the shared exponent OCP MX
  gives it (or, for the round-up presets, the smallest power of two >= amax / max) and
  its elements survive, bit for bit as the OCP conversion computes them."""
  spec = fp8jax.preset(name)
  x = _tiny_block(1e-20)
  qt, got = _qdq(x, spec)
  rule = "ocp" if spec.pow2_rounding == "ocp" else "rceil"
  scale, _, want = peers.ocp_mx(x, spec.format, rule=rule)
  assert float(np.asarray(qt.scale_inv).astype(np.float32)[0]) == scale
  np.testing.assert_array_equal(got, np.asarray(want, np.float32))
  assert np.count_nonzero(got) >= 16


@pytest.mark.slow
def test_nvfp4_quantizes_a_tensor_of_amax_1e_20_as_transformer_engine():
  """NVFP4 takes no eps either (Transformer Engine's reference quantizer has none):
  a tensor of amax 1e-20 is scaled by its own amax, by TE's order of operations."""
  spec = fp8jax.preset("nvfp4")
  x = _tiny_block(1e-20, n=64).reshape(2, 32)
  qt, got = _qdq(x, spec)
  r = ref.ref_for_spec(x, spec)  # TE's order, spec.eps = 0
  assert not ref.mismatches(got, r.deq)
  assert float(qt.tensor_scale_inv) == float(r.tensor_scale_inv) != 1.0
  assert np.count_nonzero(got) >= 32


def test_bottom_e8m0_exponent():
  """E8M0 reaches 2**-127; fp8jax clamps scales at 2**-126 (normal float32). In a block
  whose OCP exponent would be 2**-127 the elements agree except that OCP saturates the
  top binade, which fp8jax does not; with OCP's bottom at -126 they agree bit for bit."""
  spec = fp8jax.preset("mxfp8_ocp")
  x = np.float32(2.0**-119) * np.linspace(1.9, 1.0, 32, dtype=np.float32)
  x = (x * np.where(np.arange(32) % 2, -1, 1)).astype(np.float32)
  qt, got = _qdq(x, spec)
  assert np.asarray(qt.scale_inv).astype(np.float32)[0] == 2.0**-126
  _, _, at_126 = peers.ocp_mx(x, "e4m3", bottom=-126)
  np.testing.assert_array_equal(got, np.asarray(at_126, np.float32))
  scale, payload, at_127 = peers.ocp_mx(x, "e4m3")
  assert scale == 2.0**-127
  saturated = np.abs(x.astype(np.float64)) / scale > 448
  assert saturated.any() and np.all(np.abs(np.asarray(payload))[saturated] == 448)
  differ = got != np.asarray(at_127, np.float32)
  np.testing.assert_array_equal(differ, saturated & (np.abs(got) > np.abs(at_127)))


@pytest.mark.parametrize("name", ["mxfp8", "mxfp8_ocp", "mxfp4", "nvfp4"])
def test_all_zero_block_and_tensor(name):
  """Zeros come back as zeros (signs kept) with s = 1: E8M0 scale 2**0 (OCP's library
  stores 2**-127), NVFP4 tensor scale 1 and block scales 0 (TE's reference: 1/FLT_MAX and
  0). torchao's NVFP4 divides 0 by 0: NaN block scales."""
  spec = fp8jax.preset(name)
  x = np.zeros((2, 32), np.float32)
  x[1, ::3] = -0.0
  qt, got = _qdq(x, spec)
  assert not ref.mismatches(got, x)
  scale_inv = np.asarray(qt.scale_inv).astype(np.float32)
  if spec.scale_format == "e4m3":
    assert float(qt.tensor_scale_inv) == 1.0 and np.all(scale_inv == 0)
    assert np.all(np.isnan(peers.torchao_nvfp4_block_scales(x.ravel())))
  else:
    assert np.all(scale_inv == 1.0)
    ocp_scale, _, ocp_deq = peers.ocp_mx(x[0], spec.format)
    assert ocp_scale == 2.0**-127 and not np.any(ocp_deq)


@pytest.mark.parametrize("name", ["mxfp8", "mxfp8_ocp", "mxfp6_e3m2", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_nan_or_inf_inside_a_block(name, bad):
  """A NaN or ±inf element makes its whole block NaN through a NaN scale (E8M0 0xFF, an
  E4M3 NaN), as the OCP reference library and torchao's MX do with a non-finite block
  maximum; the other block is untouched."""
  spec = fp8jax.preset(name)
  x = _tiny_block(3.0, n=64).reshape(2, 32)
  x[0, 7] = bad
  qt, got = _qdq(x, spec)
  _, _, want = peers.ocp_mx(x[0, :spec.granularity.sizes[0]], spec.format)
  assert np.all(np.isnan(want)) and np.all(np.isnan(got[0, :spec.granularity.sizes[0]]))
  assert np.all(np.isfinite(got[1]))
  if spec.store_e8m0:
    assert np.asarray(qt.scale_inv)[0, 0].view(np.uint8) == 0xFF


@pytest.mark.parametrize("name", ["mxfp4", "mxfp6_e2m3", "mxfp8_ocp"])
def test_ties_round_to_even(name):
  """Elements on a midpoint round half to even, as TE's and torchao's casts do; the OCP
  reference library's default ("nearest") rounds half away from zero instead."""
  spec = fp8jax.preset(name)
  values = peers.grid(spec.format)
  mids = [(a + b) / 2 for a, b in zip(values[:-1], values[1:])]
  x = np.zeros(32, np.float32)
  x[0] = values[-1]  # X = 2**(floor(log2 max) - emax) = 1
  x[1:1 + len(mids[:31])] = mids[:31]
  x[1::2] *= -1
  _, got = _qdq(x, spec)
  _, _, even = peers.ocp_mx(x, spec.format, ties="even")
  _, _, away = peers.ocp_mx(x, spec.format, ties="nearest")
  np.testing.assert_array_equal(got, np.asarray(even, np.float32))
  differ = got != np.asarray(away, np.float32)
  assert differ.any() and np.all(np.abs(np.asarray(away))[differ] > np.abs(got[differ]))


def test_minimum_nvfp4_block_scale():
  """Block scales follow TE: any E4M3 value, subnormals (2**-8 here) and 0 included (a
  block tiny next to the tensor maximum is zero); torchao clamps them to 2**-6."""
  spec = fp8jax.preset("nvfp4")
  x = np.full(48, 0.5, np.float32)
  x[0] = 2688.0  # G: S_enc = 448 * 6 / G = 1
  x[16:32] = 6 * 2.0**-8  # block scale amax / 6 = 2**-8, an E4M3 subnormal
  x[32:48] = 1e-4  # amax / 6 < 2**-10: the block scale rounds to 0
  qt, got = _qdq(x, spec)
  r = ref.ref_for_spec(x, spec)
  scale_inv = np.asarray(qt.scale_inv).astype(np.float64)
  assert scale_inv.tolist() == [448.0, 2.0**-8, 0.0]
  assert not ref.mismatches(np.asarray(qt.scale_inv), r.scale_inv)
  assert not ref.mismatches(got, r.deq) and not np.any(got[32:])
  assert peers.torchao_nvfp4_block_scales(x).tolist() == [448.0, 2.0**-6, 2.0**-6]
  assert np.asarray(qt.scale_inv).dtype == ml_dtypes.float8_e4m3fn
