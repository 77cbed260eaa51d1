"""The callables the rules put in place of a module's matmul, and the output fake-quant
(fp8jax.rules.ops): the quantized GEMM on hand-worked values, operand order, recording,
hashability, and errors naming the op and module path."""

import functools

from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.gemm import recipes
from fp8jax.rules import Rule
from fp8jax.rules import ops as ops_lib
from tests.helpers import ref_for_spec
from tests.rules.conftest import (
  BLOCKWISE,
  ODD,
  OUT_SPEC,
  TENSOR,
  D,
  LinenMLP,
  Net,
  assert_same,
  x_input,
)


def _pow2(fmt):
  return fp8jax.QuantSpec(format=fmt, granularity=fp8jax.per_tensor(), scale_format="pow2",
                          pow2_rounding="floor")


POW2 = fp8jax.GemmConfig(roles=fp8jax.RoleSpecs(input=_pow2("e4m3"), weight=_pow2("e5m2"),
                                                grad=_pow2("e5m2")))
"""Per-tensor power-of-two scales: E4M3 inputs, E5M2 weights."""
# X: integers up to 17 in magnitude. amax 17 gives the E4M3 scale 2**floor(log2(448/17)) = 16:
# |v| <= 16 times 16 is exact in E4M3, 17 * 16 = 272 is a tie between 256 and 288 that goes
# to 256 (even), so 17 -> 16; in E5M2 9 would round to 8. W: E5M2-exact integers (1..8, 10,
# 12, 14, 16) and 13. amax 16 gives the E5M2 scale 2**floor(log2(57344/16)) = 2048, and
# 13 * 2048 = 1.101b * 2**14 is a tie between 1.10b and 1.11b that goes to 12 (even); in E4M3
# 13 is exact. So the input role on X and the weight role on W give X' = X (17 -> 16),
# W' = W (13 -> 12), and the product is exact in float32.
X = np.array([[[17, 9, -3, 2], [1, -16, 5, 9]], [[0, 4, -9, 11], [-17, 7, 6, -1]]], np.float32)
W = np.array([[13, 2, -8], [16, -13, 1], [-4, 10, 3], [7, 12, -14]], np.float32)
WANT = np.einsum("btd,de->bte", np.where(np.abs(X) == 17, np.sign(X) * 16, X),
                 np.where(np.abs(W) == 13, np.sign(W) * 12, W))


def test_quantized_einsum_and_dot_general_take_input_then_weight_roles():
  einsum, dot = jax.jit(lambda x, w: (
      ops_lib.QuantEinsum(POW2, "mix")("btd,de->bte", x, w),
      ops_lib.QuantDotGeneral(POW2, "fc")(x, w, (((2,), (0,)), ((), ())))))(X, W)
  np.testing.assert_array_equal(np.asarray(einsum), WANT)
  np.testing.assert_array_equal(np.asarray(dot), WANT)
  assert not np.array_equal(WANT, np.einsum("btd,de->bte", X, W))


def test_weight_left_swaps_the_operands_and_returns_the_dot_general_layout():
  """``dot_general(w [G, K, N], x [G, M, K])`` is [G, N, M]; the swapped call gets x first."""
  rng = np.random.default_rng(0)
  w = rng.integers(-4, 5, (2, 3, 5)).astype(np.float32)
  x = rng.integers(-4, 5, (2, 4, 3)).astype(np.float32)
  dims = (((1,), (2,)), ((0,), (0,)))
  seen = []

  def dot(lhs, rhs, dimension_numbers, precision, preferred_element_type):
    seen.append((lhs.shape, rhs.shape, dimension_numbers))
    return lax.dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type)

  out = ops_lib.weight_left(dot, jnp.asarray(w), jnp.asarray(x), dims)
  np.testing.assert_array_equal(np.asarray(out), np.einsum("gkn,gmk->gnm", w, x))
  assert seen == [((2, 4, 3), (2, 3, 5), (((2,), (1,)), ((0,), (0,))))]


def test_swap_back_orders_batch_then_lhs_free_then_rhs_free():
  # dot_general(rhs [B, R, C], lhs [B, L, C]) contracting C is [B, R, L]; lhs-first is [B, L, R]
  out = jnp.arange(2 * 3 * 5).reshape(2, 3, 5)
  dims = (((2,), (2,)), ((0,), (0,)))
  np.testing.assert_array_equal(ops_lib.swap_back(out, dims, 3, 3),
                                np.transpose(np.arange(30).reshape(2, 3, 5), (0, 2, 1)))
  no_batch = jnp.arange(4 * 2 * 3).reshape(4, 2, 3)  # rhs free [4], lhs free [2, 3]
  np.testing.assert_array_equal(ops_lib.swap_back(no_batch, (((0,), (1,)), ((), ())), 3, 2),
                                np.transpose(np.arange(24).reshape(4, 2, 3), (1, 2, 0)))


def test_recording_lists_each_call_and_marks_its_equations():
  x, w = jnp.ones((2, 4)), jnp.ones((4, 3))
  dims = (((1,), (0,)), ((), ()))
  with ops_lib.recording() as calls:
    jaxpr = jax.make_jaxpr(lambda x, w: ops_lib.quantize_output(
        ops_lib.QuantDotGeneral(TENSOR, "fc")(x, w, dims), OUT_SPEC, "fc"))(x, w)
  assert calls == [ops_lib.HookCall("dot_general", "fc", TENSOR, ((2, 4), (4, 3))),
                   ops_lib.HookCall("output", "fc", OUT_SPEC, ((2, 3),))]
  scopes = {str(e.source_info.name_stack) for e in jaxpr.eqns}
  assert any(ops_lib.MARK + "0" in s for s in scopes)
  assert any(ops_lib.MARK + "1" in s for s in scopes)
  outside = str(jax.make_jaxpr(lambda x, w: ops_lib.QuantDotGeneral(TENSOR, "fc")(x, w, dims))(
      x, w).eqns)
  assert ops_lib.MARK not in outside and calls[-1].kind == "output"  # nothing recorded after


def test_equal_configs_give_equal_hashable_callables():
  a = ops_lib.QuantDotGeneral(TENSOR, "fc")
  b = ops_lib.QuantDotGeneral(recipes.recipe("fp8_tensor"), "fc")
  assert a == b and hash(a) == hash(b)
  assert a != ops_lib.QuantDotGeneral(TENSOR, "other")
  assert a != ops_lib.QuantDotGeneral(BLOCKWISE, "fc")
  assert ops_lib.OP_CALLABLES == {"dot_general": ops_lib.QuantDotGeneral,
                                  "einsum": ops_lib.QuantEinsum,
                                  "ragged_dot": ops_lib.QuantRaggedDot}


def test_quantize_output_fake_quantizes_the_float_leaves_only():
  y = x_input((4, 128))
  tokens = jnp.arange(4, dtype=jnp.int32)
  out = jax.jit(lambda y, t: ops_lib.quantize_output({"y": y, "ids": t}, OUT_SPEC, "head"))(
      y, tokens)
  np.testing.assert_array_equal(np.asarray(out["y"]), ref_for_spec(np.asarray(y), OUT_SPEC)[2])
  assert not np.array_equal(np.asarray(out["y"]), np.asarray(y))
  np.testing.assert_array_equal(np.asarray(out["ids"]), np.arange(4))


def test_of_a_tuple_output_only_the_first_element_is_quantized():
  """``(output, *auxiliary)``: an MoE's routing weights and balance loss pass unchanged."""
  y, weights = x_input((4, 128)), x_input((4, 2)) * 0.37
  loss = jnp.float32(0.123456)
  out = jax.jit(lambda *a: ops_lib.quantize_output(tuple(a), OUT_SPEC, "moe"))(
      y, {"w": weights}, loss)
  np.testing.assert_array_equal(np.asarray(out[0]), ref_for_spec(np.asarray(y), OUT_SPEC)[2])
  np.testing.assert_array_equal(np.asarray(out[1]["w"]), np.asarray(weights))
  assert float(out[2]) == float(loss) and type(out) is tuple
  listed = ops_lib.quantize_output([y, weights], OUT_SPEC, "moe")
  assert type(listed) is list and listed[1] is weights


def test_an_output_spec_that_does_not_fit_names_the_path():
  with pytest.raises(ValueError, match=r"^output rule at 'head': .*needs axis -4"):
    ops_lib.quantize_output(jnp.ones((2, 8)), ODD, "head")
  quantized = rules_lib.quantize_model(Net(nnx.Rngs(0)), [Rule("head", ODD)])
  with pytest.raises(ValueError, match=r"output rule at 'head': .*needs axis -4"):
    quantized.head(x_input())


@pytest.mark.slow
@pytest.mark.parametrize("op, rule", [
    ("dot_general", Rule("blocks/1/fc2", ODD, role="weight")),
    ("einsum", Rule("mix", ODD, role="input", op="einsum")),
    ("dot_general", Rule("head", ODD, role="grad")),  # dY: checked in the forward pass
])
def test_a_gemm_spec_that_does_not_fit_its_operand_names_the_path(op, rule):
  """One line: the op, the module path, the spec and the operand's shape."""
  quantized = rules_lib.quantize_model(Net(nnx.Rngs(0)), [Rule(".*", TENSOR), rule])
  with pytest.raises(ValueError, match=rf"^{op} rule at '{rule.module_path}': granularity "
                                       r"2x2@\(-4, -1\) needs axis -4, but the tensor has "
                                       r"shape \([\d, ]+\) \(rank \d\)$"):
    quantized(x_input())
  params = LinenMLP().init(jax.random.key(0), x_input())
  with pytest.raises(ValueError, match=r"^dot_general rule at 'fc0_in': granularity"):
    with rules_lib.intercept([Rule("fc0_in", TENSOR), Rule("fc0_in", ODD, role="weight")]):
      LinenMLP().apply(params, x_input())


class Experts(nnx.Module):
  """A user MoE layer calling its ``ragged_dot`` hook: x [N, K], w [E, K, F]."""

  def __init__(self, rngs, ragged_dot=lax.ragged_dot):
    self.w = nnx.Param(jax.random.normal(rngs.params(), (2, D, 16)))
    self.ragged_dot = ragged_dot

  def __call__(self, x, group_sizes):
    return self.ragged_dot(x, self.w[...], group_sizes)


@pytest.mark.slow
def test_ragged_dot_rules_route_through_the_grouped_gemm():
  x, sizes = x_input((24, D)), jnp.array([10, 14], jnp.int32)
  hand = Experts(nnx.Rngs(0), functools.partial(fp8jax.gemm.grouped.fp8_ragged_dot,
                                                config=BLOCKWISE))
  quantized = rules_lib.quantize_model(Experts(nnx.Rngs(0)),
                                       [Rule("", BLOCKWISE, op="ragged_dot")])
  grad = lambda m: jax.value_and_grad(lambda x: jnp.sum(jnp.sin(m(x, sizes))))(x)  # noqa: E731
  assert_same(grad(quantized), grad(hand))
  assert not np.array_equal(Experts(nnx.Rngs(0))(x, sizes), quantized(x, sizes))
