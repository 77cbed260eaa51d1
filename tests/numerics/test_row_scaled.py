"""Row-scaled NVFP4 (``QuantSpec(row_scaled=True)``, fp8jax/numerics/scales.py): against the
NumPy reference of tests/references/reference_te2026.py bit for bit, each row quantized as
a tensor of its own, the fused round trip and Four Over Six per row, the GEMMs' alpha per
row and column, its spec errors, policy records and recipe. Transformer Engine's own
reference is checked in tests/references/test_te_nvfp4_bits.py."""

from hypothesis import given, settings
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import accumulate, grouped_tensor_core
from fp8jax.quant import fused_round_trip
from models import policy as policy_lib
from tests import strategies as hs
from tests.references import reference_te2026 as ref

ROW = fp8jax.preset("nvfp4_row_scaled").replace(backward=None)


@jax.jit
def _quantize(x):
  q = fp8jax.quantize(x, ROW)
  return q.data.astype(jnp.float32), q.scale_inv.astype(jnp.float32), q.tensor_scale_inv, \
      fp8jax.dequantize(q, jnp.float32)


def _spread(x, binades):
  """``x`` with its rows scaled over ``binades`` binades (row-scaling matters)."""
  return (x * np.float32(2.0) ** -np.linspace(0, binades, x.shape[0], dtype=np.float32)[
      :, None]).astype(np.float32)


@settings(max_examples=hs.examples(4, 30), deadline=None)
@given(x=hnp.arrays(np.float32, st.sampled_from([(5, 48), (4, 40)]),
                    elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=False)),
       binades=st.integers(0, 40), zero_row=st.booleans())
def test_quantize_matches_the_reference_bit_for_bit(x, binades, zero_row):
  x = _spread(x, binades)
  if zero_row:
    x[1] = 0.0
  q, s, level, deq = (np.asarray(v) for v in _quantize(jnp.asarray(x)))
  pay, want_s, want_level, want_deq = ref.two_level(x, row_scaled=True)
  np.testing.assert_array_equal(q, pay.astype(np.float32))
  np.testing.assert_array_equal(s, want_s.astype(np.float32))
  np.testing.assert_array_equal(level[:, 0], want_level.astype(np.float32))
  np.testing.assert_array_equal(deq, want_deq.astype(np.float32))


def _as_tensors(spec):
  """Quantizes each row of [R, C] as a tensor of its own (vmapped): payload codes, block
  scales, dequantized values."""
  def one(row):
    q = fp8jax.quantize(row[None], spec)
    return q.data[0], q.scale_inv[0].astype(jnp.float32), q.tensor_scale_inv, \
        fp8jax.dequantize(q, jnp.float32)[0]
  return jax.jit(jax.vmap(one))


def test_each_row_is_quantized_as_a_tensor_of_its_own():
  rng = np.random.default_rng(1)
  x = _spread(rng.standard_normal((15, 48)).astype(np.float32), 30)
  x[7, 7] = np.nan  # a NaN marks its block only; the row's level skips it
  got = jax.jit(lambda v: fp8jax.quantize(v, ROW))(jnp.asarray(x.reshape(3, 5, 48)))
  assert got.tensor_scale_inv.shape == (3, 5, 1)
  data, s, level, _ = _as_tensors(fp8jax.preset("nvfp4").replace(backward=None))(
      jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(got.data).reshape(15, 48).view(np.uint8),
                                np.asarray(data).view(np.uint8))
  np.testing.assert_array_equal(np.asarray(got.scale_inv, np.float32).reshape(15, 3),
                                np.asarray(s))
  np.testing.assert_array_equal(np.asarray(got.tensor_scale_inv).reshape(15), np.asarray(level))


@pytest.mark.parametrize("four_over_six", [None, "mae", "mse"])
def test_fused_round_trip_equals_the_payload_path(four_over_six):
  spec = ROW.replace(four_over_six=four_over_six)
  x = jnp.asarray(_spread(np.random.default_rng(2).standard_normal((6, 40)), 24))
  want = jax.jit(lambda v: fp8jax.dequantize(fp8jax.quantize(v, spec), jnp.float32))(x)
  got = jax.jit(lambda v: fused_round_trip.quantize_dequantize_fused(v, spec))(x)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_four_over_six_row_scaled_is_four_over_six_of_each_row():
  spec = ROW.replace(four_over_six="mse")
  x = jnp.asarray(_spread(np.random.default_rng(3).standard_normal((4, 32)), 20))
  got = jax.jit(lambda v: fp8jax.dequantize(fp8jax.quantize(v, spec), jnp.float32))(x)
  want = _as_tensors(spec.replace(row_scaled=False))(x)[3]
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_columns_of_a_tile_along_the_rows_have_their_own_level():
  """A 1-D tile along axis -2 (a GEMM operand read contraction-first): one level per
  column, as the transpose's rows."""
  x = _spread(np.random.default_rng(4).standard_normal((6, 48)).astype(np.float32), 30)
  col = ROW.replace(granularity=fp8jax.tile(16, axis=-2))
  got, want = jax.jit(lambda u, v: (fp8jax.quantize(u, col), fp8jax.quantize(v, ROW)))(
      jnp.asarray(x.T.copy()), jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(got.tensor_scale_inv).T,
                                np.asarray(want.tensor_scale_inv))
  np.testing.assert_array_equal(np.asarray(got.data).view(np.uint8).T,
                                np.asarray(want.data).view(np.uint8))


def test_gemm_alpha_scales_rows_of_a_and_columns_of_bt():
  rng = np.random.default_rng(5)
  a = jnp.asarray(_spread(rng.standard_normal((8, 64)).astype(np.float32), 20)[None])
  bt = jnp.asarray(_spread(rng.standard_normal((6, 64)).astype(np.float32), 12)[None])
  aq, bq = jax.jit(lambda u, v: (fp8jax.quantize(u, ROW), fp8jax.quantize(v, ROW)))(a, bt)
  y = np.asarray(jax.jit(accumulate.scaled_matmul)(aq, bq))
  da, db = (np.asarray(fp8jax.dequantize(q, jnp.float32), np.float64) for q in (aq, bq))
  want = np.einsum("bmk,bnk->bmn", da, db)
  bound = np.einsum("bmk,bnk->bmn", np.abs(da), np.abs(db)) * 2e-6  # float32 sums
  assert np.all(np.abs(y - want) <= bound)
  with pytest.raises(ValueError, match="per row along the contraction"):
    accumulate.row_level(jnp.ones((1, 1, 64)), (1, 8, 64), False)


def test_grouped_alpha_broadcasts_rows_groups_and_columns():
  a, b = jnp.asarray([[2.0], [3.0], [5.0]]), jnp.asarray([7.0, 11.0])
  got = grouped_tensor_core._alpha(a, b, jnp.asarray([0, 1, 1]))
  np.testing.assert_array_equal(np.asarray(got), [[14.0], [33.0], [55.0]])
  per_row_b = jnp.asarray([[[1.0], [2.0]], [[3.0], [4.0]]])  # [E, cols, 1]
  got = grouped_tensor_core._alpha(None, per_row_b, jnp.asarray([1, 0]))
  np.testing.assert_array_equal(np.asarray(got), [[3.0, 4.0], [1.0, 2.0]])
  got = grouped_tensor_core._alpha(a, jnp.asarray([[7.0], [11.0]]), None)  # Wgrad: [K, F]
  np.testing.assert_array_equal(np.asarray(got), [[14.0, 22.0], [21.0, 33.0], [35.0, 55.0]])


@pytest.mark.slow
def test_recipe_row_scales_the_activations_only():
  base, cfg = fp8jax.recipe("nvfp4_recipe"), fp8jax.recipe("nvfp4_row_scaled")
  assert cfg.roles.input == base.roles.input.replace(row_scaled=True)
  assert cfg.replace(roles=base.roles) == base
  assert not cfg.roles.weight.row_scaled and not cfg.roles.grad.row_scaled
  x = jnp.asarray(_spread(np.random.default_rng(6).standard_normal((8, 32)), 16))
  w = jnp.asarray(np.random.default_rng(7).standard_normal((32, 16)), jnp.float32)
  y, grads = jax.value_and_grad(lambda x, w: jnp.sum(fp8jax.fp8_dot_general(
      x, w, (((1,), (0,)), ((), ())), config=cfg) ** 2), (0, 1))(x, w)
  assert np.isfinite(float(y)) and all(np.all(np.isfinite(g)) for g in grads)


@pytest.mark.parametrize("bad, match", [
    (dict(scale_format="fp32"), "row_scaled sets"),
    (dict(granularity=fp8jax.block((16, 16))), "row_scaled sets"),
    (dict(rounding="ms_eden"), "row_scaled sets"),
    (dict(row_scaled=1), "row_scaled must be a bool"),
])
def test_spec_refuses_what_row_scaling_cannot_do(bad, match):
  with pytest.raises((ValueError, TypeError), match=match):
    ROW.replace(**bad)


def test_policy_records_leave_row_scaled_out_at_its_default():
  plain = policy_lib.site_policy("attn_out", "0", fp8jax.preset("nvfp4"))
  rowed = policy_lib.site_policy("attn_out", "0", fp8jax.preset("nvfp4_row_scaled"))
  assert "row_scaled" not in str(policy_lib.record(plain))
  assert policy_lib.record(rowed)["rules"][0]["spec"]["row_scaled"] is True
  assert ROW.describe() == "e2m1 1x16@-1 current e4m3+fp32/row"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nvfp4_row_scaled", "nvfp4_ue5m3"])
def test_recipes_in_the_grouped_gemm_on_both_accumulators(name):
  """The expert GEMM (an empty expert; rows 2 binades apart on average): the tensor-core
  model (row levels through ``grouped_tensor_core``) equals the FP32 accumulation to its
  rounding, and the gradients are finite and near the exact ones."""
  from fp8jax.gemm import grouped

  x = jax.random.normal(jax.random.key(0), (128, 128)) * jnp.exp(
      2 * jax.random.normal(jax.random.key(5), (128, 1)))
  w = jax.random.normal(jax.random.key(3), (3, 128, 96)) * 0.1
  sizes = jnp.array([40, 0, 88], jnp.int32)
  exact = lambda x, w: jnp.concatenate([x[:40] @ w[0], x[40:] @ w[2]])  # noqa: E731
  tc = accumulate.Accumulation("tensor_core", block_size=16, promotion_interval=16)
  base = fp8jax.recipe(name).replace(wgrad_hadamard=0)
  ys, gs = [], []
  for cfg in (base, base.replace(accumulation=tc)):
    f = lambda x, w, cfg=cfg: grouped.fp8_ragged_dot(x, w, sizes, cfg)  # noqa: E731
    ys.append(np.asarray(jax.jit(f)(x, w)))
    gs.append(jax.jit(jax.grad(lambda x, w, f=f: jnp.sum(f(x, w) ** 2), argnums=(0, 1)))(
        x, w))
  np.testing.assert_allclose(ys[1], ys[0], rtol=1e-3, atol=1e-3 * np.abs(ys[0]).max())
  want = jax.grad(lambda x, w: jnp.sum(exact(x, w) ** 2), argnums=(0, 1))(x, w)
  for g in gs:
    for got, ref_g in zip(g, want):
      assert bool(jnp.all(jnp.isfinite(got)))
      assert float(jnp.linalg.norm(got - ref_g) / jnp.linalg.norm(ref_g)) < 0.35
