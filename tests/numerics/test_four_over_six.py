"""Four Over Six (fp8jax/numerics/four_over_six.py) against a NumPy float32 loop written
from Transformer Engine's reference quantizer (reference_nvfp4.py, lines 523-648, commit
d0067d0d), element by element: the chosen scale of every block, the payloads and the
dequantized values, bit for bit."""


import functools

from hypothesis import example, given, settings
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from fp8jax.numerics import four_over_six
from fp8jax.quant import fused_round_trip
from tests import strategies as hs

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


def _e4m3(v):
  return F32(ml_dtypes.float8_e4m3fn(F32(min(v, F32(448.0)))))


def _e2m1(v):
  return F32(ml_dtypes.float4_e2m1fn(F32(min(max(v, F32(-6.0)), F32(6.0)))))


def reference(x: np.ndarray, rule: str, e: int = 256, block: int = 16, force_six=False):
  """(scale_inv [R, C/16], payload [R, C], dequantized [R, C] float32, chose 4 [R, C/16])
  of a 2-D float32 ``x`` in 1 x ``block`` blocks, as TE's reference loops compute them."""
  x = np.asarray(x, np.float32)
  g = F32(np.max(np.abs(x)))
  s_enc = F32(F32(6 * e) / g) if g > 0 else F32(1.0)
  d = F32(F32(1.0) / s_enc)
  rows, cols = x.shape
  inv = np.zeros((rows, cols // block), np.float32)
  four = np.zeros_like(inv, bool)
  q_out = np.zeros_like(x)
  for r in range(rows):
    for b in range(cols // block):
      vals = x[r, b * block:(b + 1) * block]
      vmax = F32(np.max(np.abs(vals)))
      base = F32(F32(vmax / F32(6.0)) * s_enc)
      cands = []
      for factor in (F32(1.0), F32(1.5)):
        sd = _e4m3(F32(base * factor))
        prod = F32(sd * d)
        enc = FLT_MAX if prod == 0 else F32(min(F32(F32(1.0) / prod), FLT_MAX))
        q = [_e2m1(F32(v * enc)) for v in vals]
        err = F32(0.0)
        for qi, v in zip(q, vals):
          diff = F32(F32(F32(F32(qi * sd) * g) / F32(6 * e)) - v)
          err = F32(err + (abs(diff) if rule == "mae" else F32(diff * diff)))
        cands.append((sd, q, err))
      (sd6, q6, err6), (sd4, q4, err4) = cands
      four[r, b] = err4 < err6 and not force_six
      sd, q = (sd4, q4) if four[r, b] else (sd6, q6)
      inv[r, b] = sd
      q_out[r, b * block:(b + 1) * block] = q
  deq = ((q_out * np.repeat(inv, block, axis=1)).astype(np.float32) * d).astype(np.float32)
  return inv, q_out, deq, four


def _spec(rule, e=256):
  return fp8jax.preset("nvfp4").replace(backward=None, four_over_six=rule,
                                        four_over_six_max=e)


@functools.cache
def _routes(spec, block=(1, 16)):
  """Jitted (QTensor route's scale_inv, payload, dequantized; the fused round trip; the
  choice of 4) of ``spec``."""
  def quantized(x):
    qt = fp8jax.quantize(x, spec)
    return (qt.scale_inv.astype(jnp.float32), qt.data.astype(jnp.float32),
            fp8jax.dequantize(qt, jnp.float32))
  return (jax.jit(quantized),
          jax.jit(lambda x: fused_round_trip.quantize_dequantize_fused(x, spec)),
          jax.jit(lambda x: four_over_six.scales_of(x, block, spec)[3]))


def _check(x, rule, e=256):
  inv, q, deq, four = reference(x, rule, e)
  quantized, fused, chose = _routes(_spec(rule, e))
  got_inv, got_q, got = (np.asarray(v) for v in quantized(jnp.asarray(x)))
  np.testing.assert_array_equal(got_inv, inv)
  np.testing.assert_array_equal(got_q, q)
  np.testing.assert_array_equal(got.view(np.uint32), deq.view(np.uint32))
  np.testing.assert_array_equal(np.asarray(fused(jnp.asarray(x))).view(np.uint32),
                                deq.view(np.uint32))
  np.testing.assert_array_equal(np.asarray(chose(jnp.asarray(x))), four)
  return four


def reference_2d(x: np.ndarray, rule: str, e: int = 256):
  """(scale_inv [R/16, C/16], chose 4) of ``x`` in 16 x 16 blocks: one maximum per block,
  each row's error summed along it, the 16 rows added as TE's reference does (rows 0-7 +
  8-15, 0-3 + 4-7, 0-1 + 2-3, 0 + 1)."""
  x = np.asarray(x, np.float32)
  g = F32(np.max(np.abs(x)))
  s_enc = F32(F32(6 * e) / g) if g > 0 else F32(1.0)
  d = F32(F32(1.0) / s_enc)
  inv = np.zeros((x.shape[0] // 16, x.shape[1] // 16), np.float32)
  four = np.zeros_like(inv, bool)
  for i in range(inv.shape[0]):
    for j in range(inv.shape[1]):
      tile = x[16 * i:16 * (i + 1), 16 * j:16 * (j + 1)]
      base = F32(F32(F32(np.max(np.abs(tile))) / F32(6.0)) * s_enc)
      errs, sds = [], []
      for factor in (F32(1.0), F32(1.5)):
        sd = _e4m3(F32(base * factor))
        prod = F32(sd * d)
        enc = FLT_MAX if prod == 0 else F32(min(F32(F32(1.0) / prod), FLT_MAX))
        rows = []
        for row in tile:
          err = F32(0.0)
          for v in row:
            diff = F32(F32(F32(F32(_e2m1(F32(v * enc)) * sd) * g) / F32(6 * e)) - v)
            err = F32(err + (abs(diff) if rule == "mae" else F32(diff * diff)))
          rows.append(err)
        while len(rows) > 1:
          half = len(rows) // 2
          rows = [F32(a + b) for a, b in zip(rows[:half], rows[half:])]
        errs.append(rows[0])
        sds.append(sd)
      four[i, j] = errs[1] < errs[0]
      inv[i, j] = sds[1] if four[i, j] else sds[0]
  return inv, four


def _tie_block():
  """A 16 x 16 block whose MAE ties between 4 and 6 in exact arithmetic (12 either way):
  a division by 6E rounded as a multiply by its reciprocal broke the tie towards 4."""
  x = np.zeros((32, 32), np.float32)
  x[0, 0], x[0, 1], x[1, 0] = 74.0, 98.0, 62.0
  return x


@settings(max_examples=10, deadline=None)
@given(x=hnp.arrays(np.float32, (32, 32),  # subnormals count as 0 in an amax (formats.md)
                   elements=st.floats(-100, 100, width=32, allow_subnormal=False)),
       rule=st.sampled_from(["mae", "mse"]))
@example(x=_tie_block(), rule="mae")
def test_weight_blocks_16x16_match_te_reference(x, rule):
  spec = fp8jax.preset("nvfp4_weight").replace(four_over_six=rule)
  inv, four = reference_2d(x, rule)
  quantized, _, chose = _routes(spec, (16, 16))
  np.testing.assert_array_equal(np.asarray(quantized(jnp.asarray(x))[0]), inv)
  np.testing.assert_array_equal(np.asarray(chose(jnp.asarray(x))), four)


def test_block_error_sums_rows_in_order_then_as_a_tree():
  # Row sums 2**24, then fifteen 1s. One after another every 1 is lost (2**24 + 1 rounds
  # to 2**24); as TE's tree adds them, 2**24 + 14.
  diff = np.zeros((1, 16, 1, 16), np.float32)
  diff[0, :, 0, 0] = [2.0**24] + [1.0] * 15
  tree = four_over_six.block_error(jnp.asarray(diff), (1, 3))
  assert float(tree.reshape(())) == 2.0**24 + 14
  row = four_over_six.block_error(jnp.asarray(diff[:, :, :, :1].transpose(0, 3, 2, 1)), (1, 3))
  assert float(row.reshape(())) == 2.0**24  # 1 x 16: one after another


_VALUES = st.one_of(st.just(0.0), st.floats(1e-3, 1e3), st.floats(-1e3, -1e-3))


@pytest.mark.slow
@settings(max_examples=hs.examples(10, 25), deadline=None)
@given(x=hnp.arrays(np.float32, (3, 64), elements=_VALUES),
       rule=st.sampled_from(["mae", "mse"]), e=st.sampled_from([256, 448]))
def test_matches_te_reference_bit_for_bit(x, rule, e):
  _check(x, rule, e)


def test_both_choices_occur_and_four_fits_the_grid():
  # Block 0: values at 5/6 of the maximum (4/6 maps them onto 4's finer grid); block 1:
  # the E2M1 grid itself times 6/6 (exact at 6, so 6 wins).
  rng = np.random.default_rng(0)
  near = np.concatenate([[6.0], np.full(15, 5.0)]).astype(np.float32)
  grid = np.array([6, 4, 3, 2, 1.5, 1, 0.5, 0] * 2, np.float32)
  x = np.stack([np.concatenate([near, grid]),
                rng.normal(size=32).astype(np.float32)])
  four = _check(x, "mae")
  assert four[0, 0] and not four[0, 1]


def test_block_scale_divides_first_as_te_does():
  # G = 100: S_enc = 1536 / 100. For a block maximum of 59.375, (59.375 / 6) * S_enc is
  # 151.99998 (E4M3: 144) while 59.375 * (S_enc / 6) is 152.0 (E4M3: 160, a tie to even).
  s_enc = jnp.float32(1536.0) / jnp.float32(100.0)
  six, four = four_over_six.candidates(jnp.float32(59.375), s_enc)
  assert (float(six), float(four)) == (144.0, 224.0)
  x = np.zeros((1, 32), np.float32)
  x[0, 0], x[0, 16] = 100.0, 59.375
  x[0, 17:] = np.linspace(-50, 50, 15, dtype=np.float32)
  _check(x, "mae")


def test_ties_and_all_zero_blocks_keep_six():
  x = np.zeros((1, 32), np.float32)
  x[0, 16:] = [4, 2, 1, 0.5] * 4  # 4 maps onto 4 or 6 exactly, both errors 0
  x[0, 16] = 6.0
  four = _check(x, "mse")
  assert not four.any()


def test_non_finite_block_is_nan_as_a_whole():
  x = np.ones((1, 32), np.float32)
  x[0, 3] = np.nan
  out = np.asarray(fp8jax.fake_quant(jnp.asarray(x), _spec("mae")))
  assert np.isnan(out[0, :16]).all() and np.isfinite(out[0, 16:]).all()


def test_four_only_where_it_lowers_the_blocks_error():
  rng = np.random.default_rng(1)
  x = (rng.standard_t(3, size=(8, 256)) * 10).astype(np.float32)
  # The library's choice and values, against the reference with 4 switched off.
  quantized, _, chose = _routes(_spec("mae"))
  deq = np.asarray(quantized(jnp.asarray(x))[2])
  four = np.asarray(chose(jnp.asarray(x)))
  _, _, deq6, _ = reference(x, "mae", force_six=True)
  err = np.abs(deq.astype(np.float64) - x).reshape(8, 16, 16).sum(-1)
  err6 = np.abs(deq6.astype(np.float64) - x).reshape(8, 16, 16).sum(-1)
  assert four.any() and not four.all()
  np.testing.assert_array_equal(err[~four], err6[~four])
  assert (err[four] <= err6[four] * (1 + 1e-6)).all()
  assert err.sum() < err6.sum()


@pytest.mark.slow
def test_recipe_fprop_is_the_product_of_its_four_over_six_operands():
  cfg = fp8jax.recipe("nvfp4_4over6")
  assert cfg.wgrad_hadamard == 0 and cfg.roles.grad.four_over_six is None
  x = jax.random.normal(jax.random.key(0), (32, 64)) * 3
  w = jax.random.normal(jax.random.key(1), (64, 48)) * 0.1
  y = fp8jax.fp8_dot_general(x, w, (((1,), (0,)), ((), ())), config=cfg)
  xq = fp8jax.dequantize(fp8jax.quantize(x, cfg.roles.input), jnp.float32)
  wq = fp8jax.dequantize(fp8jax.quantize(w.T, cfg.roles.weight), jnp.float32)
  plain = fp8jax.dequantize(fp8jax.quantize(x, cfg.roles.input.replace(
      four_over_six=None, four_over_six_max=256)), jnp.float32)
  assert not np.array_equal(np.asarray(xq), np.asarray(plain))  # 4/6 changed the operand
  want = np.asarray(xq, np.float64) @ np.asarray(wq, np.float64).T
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("bad, match", [
    (dict(four_over_six="l1"), "unknown four_over_six"),
    (dict(four_over_six="mae", scale_format="fp32"), "scale_format='e4m3'"),
    (dict(four_over_six="mae", rounding="stochastic", sr_bits=8), "rounding='nearest'"),
    (dict(four_over_six="mae", four_over_six_max=300), "four_over_six_max must be one of"),
    (dict(four_over_six_max=448), "applies to four_over_six only")])
def test_spec_refuses_what_four_over_six_cannot_do(bad, match):
  base = fp8jax.preset("nvfp4").replace(backward=None)
  if bad.get("scale_format") == "fp32":
    base = fp8jax.QuantSpec(format="e2m1", granularity=fp8jax.tile(16))
    bad = {k: v for k, v in bad.items() if k != "scale_format"}
  with pytest.raises(ValueError, match=match):
    base.replace(**bad)


def test_describe_names_the_rule():
  assert _spec("mae").describe().endswith("4/6-mae")
  assert "4/6-mse@448" in _spec("mse", 448).describe()
