"""Tensor-core accumulation in the grouped GEMM (fp8jax.gemm.grouped_tensor_core): per
expert, hand-worked values where the model's truncation shows, the dense model and a NumPy
loop bit for bit, and the Wgrad layout's errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import accumulate
from fp8jax.gemm import grouped as grouped_gemm
from fp8jax.gemm import grouped_tensor_core as gtc
from fp8jax.quant import qtensor
from tests.gemm.conftest import nonempty_experts, ragged_case
from tests.references import reference_gemm as rg

POW2 = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.per_tensor(), scale_format="pow2",
                        pow2_rounding="floor")
"""Per-tensor E4M3 with power-of-two scales: amax 8 gives the scale 2**floor(log2(448/8)) =
32, so 8 -> payload 256, 3/32 -> 3, 1/32 -> 1 and every integer up to 8 -> a multiple of 32,
all exact."""
SMALL = accumulate.Accumulation("tensor_core", block_size=4, promotion_interval=8)


def _per_group(w):
  return jax.vmap(lambda v: qtensor.quantize(v, POW2))(w)


def test_rows_product_takes_each_rows_group_weight_and_truncates_like_a_tensor_core():
  """Row 0 . W_0 row 0 is 64 + 3/1024: payload products 256 * 256 = 2**16 and 3 * 1 = 3 in
  one block, aligned to 13 fraction bits below 2**16 (multiples of 8), drop the 3, so 64.
  Row 2 (group 1) . W_1 row 0: 16384 and -288 align to multiples of 2: exact, 16 - 9/32.
  Row 3 is past sum(sizes): zero."""
  x = np.array([[8, 3 / 32], [1, 2], [8, 3 / 32], [5, 5]], np.float32)
  w = np.array([[[8, 1 / 32], [1, 1]], [[2, -3], [8, 1 / 32]]], np.float32)
  sizes = np.array([1, 2], np.int32)
  y = jax.jit(lambda x, w, s: gtc.rows_product(qtensor.quantize(x, POW2), _per_group(w), s,
                                               accumulate.HOPPER, tile=2))(x, w, sizes)
  want = np.array([[64, 8 + 3 / 32], [-4, 8 + 1 / 16], [16 - 9 / 32, 64], [0, 0]], np.float32)
  np.testing.assert_array_equal(np.asarray(y), want)
  assert x[0] @ w[0, 0] == np.float32(64 + 3 / 1024)  # float32 accumulation keeps the 3


def _padded(groups, offsets, n_pad):
  """Rows of each group placed at its offset of the padded layout, zeros elsewhere."""
  out = np.zeros((n_pad, len(groups[0][0])), np.float32)
  for rows, start in zip(groups, offsets, strict=True):
    out[start:start + len(rows)] = rows
  return out


# Groups of 2, 0 and 3 tokens padded to 8, 0 and 8 rows (intervals of SMALL): dW_0's first
# entry is 8 * 8 + (3/32) * (1/32) = 64 + 3/1024, truncated to 64 as above.
X_PAD = _padded([[[8, 1], [3 / 32, 2]], [[1, -2], [4, 0], [0, 5]]], [0, 8], 16)
DY_PAD = _padded([[[8], [1 / 32]], [[3], [-1], [2]]], [0, 8], 16)
PADDED = np.array([8, 0, 8], np.int32)
DW = np.array([[[64], [8 + 1 / 16]], [[0], [0]], [[-1], [4]]], np.float32)


@pytest.mark.parametrize("acc", [SMALL, accumulate.Accumulation(
    "tensor_core", block_size=4, promotion_interval=None)], ids=["promote_8", "never"])
def test_wgrad_product_contracts_each_groups_rows(acc):
  dw = jax.jit(lambda a, b, p: gtc.wgrad_product(qtensor.quantize(a, POW2),
                                                 qtensor.quantize(b, POW2), p, acc))(
      X_PAD.T, DY_PAD.T, PADDED)
  np.testing.assert_array_equal(np.asarray(dw), DW)


def test_wgrad_product_refuses_a_layout_it_cannot_promote_in():
  """Checked on the shapes, so traced abstractly (``jax.eval_shape``)."""
  def wgrad(a, b, padded, a_spec=POW2, acc=SMALL):
    return jax.eval_shape(lambda a, b, p: gtc.wgrad_product(
        qtensor.quantize(a, a_spec), qtensor.quantize(b, POW2), p, acc), a, b, padded)

  with pytest.raises(ValueError, match=r"^12 padded rows are not whole intervals of 8"):
    wgrad(X_PAD.T[:, :12], DY_PAD.T[:, :12], np.array([8, 0, 4], np.int32))
  with pytest.raises(ValueError, match=r"a tensor-core accumulator that never promotes needs "
                                       r"Wgrad scales constant along the tokens"):
    wgrad(X_PAD.T, DY_PAD.T, PADDED, fp8jax.QuantSpec(granularity=fp8jax.tile(4)),
          accumulate.HOPPER_NO_PROMOTION)
  assert wgrad(X_PAD.T, DY_PAD.T, PADDED).shape == (3, 2, 1)


DN = (((1,), (0,)), ((), ()))


def _vjp(fn, a, b, ct):
  """(fn(a, b), d/da, d/db) for the cotangent ct."""
  y, vjp = jax.vjp(fn, a, b)
  return (y, *vjp(ct))


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["requant", "double", "scaling_aware"])
def test_tensor_core_accumulation_equals_dense_per_expert_bit_for_bit(policy):
  """Ragged groups (none a multiple of the promotion interval, one empty): each expert's
  rows of Y and dX and its dW equal fp8_dot_general with the same accumulator on the
  expert's rows alone, bit for bit. eps=0 gives the all-zero padding rows of the Wgrad
  layout scale 1, above the real rows' scales: the transposes must not see them."""
  x, w, dy, sizes = ragged_case(sizes=(150, 0, 37), k=160, f=144, seed=3)
  cfg = fp8jax.GemmConfig(roles=fp8jax.deepseek_v3_roles(eps=0.0), transpose=policy,
                          accumulation=fp8jax.gemm.accumulate.HOPPER)
  y, dx, dw = jax.jit(lambda a, b, c: _vjp(
      lambda p, q: grouped_gemm.fp8_ragged_dot(p, q, sizes, cfg), a, b, c))(x, w, dy)
  dense = jax.jit(lambda a, b, c: _vjp(
      lambda p, q: fp8jax.fp8_dot_general(p, q, DN, config=cfg), a, b, c))
  for e, rows in nonempty_experts(sizes, dw):
    ye, dxe, dwe = dense(x[rows], w[e], dy[rows])
    np.testing.assert_array_equal(y[rows], ye)
    np.testing.assert_array_equal(dx[rows], dxe)
    np.testing.assert_array_equal(dw[e], dwe)


def _rows_and_scales(qt):
  """A 2-D QTensor's payload [R, K] (float32) and scale_inv per row and K block."""
  s = np.repeat(np.asarray(qt.scale_inv, np.float32), qt.full_block[-2], axis=0)
  return np.asarray(qt.data, np.float32), s[: qt.shape[-2]], qt.full_block[-1]


def _loop(a_qt, b_qt, rows, cols):
  """tests/reference_gemm's loop model on the given rows of A and rows of Bt."""
  a, sa, ka = _rows_and_scales(a_qt)
  b, sb, kb = _rows_and_scales(b_qt)
  return rg.ref_tensor_core_matmul(a[rows], b[cols], sa[rows], sb[cols], ka, kb)


@pytest.mark.slow
def test_tensor_core_grouped_against_numpy_loops():
  """A few outputs of each GEMM of one expert (rows 40..239 of the sorted rows, after an
  expert of 40 and an empty one) against the loop reference on that expert's operands,
  quantized on their own: X, dY in 1x128 tiles, W in 128x128 blocks (Fprop W_e^T, Dgrad
  W_e), X_e^T and dY_e^T in tiles along the expert's 200 tokens."""
  x, w, dy, sizes = ragged_case(sizes=(40, 0, 200), k=160, f=144, seed=4)
  cfg = fp8jax.recipe("hopper_blockwise")
  y, dx, dw = jax.jit(lambda a, b, c: _vjp(
      lambda p, q: grouped_gemm.fp8_ragged_dot(p, q, sizes, cfg), a, b, c))(x, w, dy)
  r = cfg.roles

  @jax.jit
  def operands(xe, dye, we):  # the expert's operands of Fprop, Dgrad and Wgrad
    q = fp8jax.quantize
    return ((q(xe, r.input), q(we.T, r.weight)), (q(dye, r.grad), q(we, r.weight)),
            (q(xe.T, r.input), q(dye.T, r.grad)))

  fprop, dgrad, wgrad = operands(x[40:], dy[40:], w[2])
  rows, cols, kcols = [0, 7, 131, 199], [0, 5, 128, 143], [0, 31, 129, 159]
  np.testing.assert_array_equal(np.asarray(y)[40:][np.ix_(rows, cols)],
                                _loop(*fprop, rows, cols))
  np.testing.assert_array_equal(np.asarray(dx)[40:][np.ix_(rows, kcols)],
                                _loop(*dgrad, rows, kcols))
  np.testing.assert_array_equal(np.asarray(dw)[2][np.ix_(kcols, cols)],
                                _loop(*wgrad, kcols, cols))
  # Not FP32 accumulation under another name: the FP32 grouped GEMM differs.
  y32 = jax.jit(lambda a, b: grouped_gemm.fp8_ragged_dot(
      a, b, sizes, fp8jax.recipe("fp32_blockwise")))(x, w)
  assert not np.array_equal(np.asarray(y32), np.asarray(y))


@pytest.mark.slow
def test_tensor_core_never_promoting_needs_scales_constant_along_the_tokens():
  x, w, dy, sizes = ragged_case(sizes=(20, 12), k=64, f=32, seed=5)
  acc = fp8jax.gemm.accumulate.HOPPER_NO_PROMOTION
  spec = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.per_tensor())
  cfg = fp8jax.GemmConfig(roles=fp8jax.RoleSpecs(input=spec, weight=spec, grad=spec),
                          accumulation=acc)
  wgrad = jax.jit(jax.grad(lambda b, c: jnp.sum(grouped_gemm.fp8_ragged_dot(x, b, sizes, c) * dy)),
                  static_argnums=1)
  g = wgrad(w, cfg)
  assert np.all(np.isfinite(g)) and np.any(g != 0)
  tiles = cfg.replace(roles=fp8jax.deepseek_v3_roles())  # 1x128 tiles along the tokens
  with pytest.raises(ValueError, match="never promotes"):
    wgrad(w, tiles)


