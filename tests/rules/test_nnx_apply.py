"""Rules on an NNX model (fp8jax.rules.nnx_apply): the quantized copy equals fp8jax ops placed
by hand, leaves the original and the unmatched modules alone, and keeps one static structure
for equal rules."""

import dataclasses
import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.gemm import recipes
from fp8jax.rules import Rule, Rules, nnx_apply
from fp8jax.rules import ops as ops_lib
from tests.helpers import ref_for_spec
from tests.rules.conftest import (
  BLOCKWISE,
  NNX_RULES,
  OUT_SPEC,
  TENSOR,
  W_SPEC,
  Block,
  Net,
  assert_same,
  hand_dot,
  x_input,
)


def _logits_and_grads(model, x):
  graphdef, state = nnx.split(model)

  def loss(s):
    y = nnx.merge(graphdef, s)(x)
    return jnp.sum(jnp.sin(y)), y

  (_, y), g = jax.value_and_grad(loss, has_aux=True)(state)
  return y, g


@pytest.mark.slow
def test_nnx_rules_equal_hand_placed_ops_bit_for_bit():
  model = Net(nnx.Rngs(0))
  tensor_w = TENSOR.replace(roles=dataclasses.replace(TENSOR.roles, weight=W_SPEC))
  hand = Net(nnx.Rngs(0), hand={
      0: {"dot1": hand_dot(BLOCKWISE), "dot2": hand_dot(TENSOR)},
      1: {"dot1": hand_dot(TENSOR), "dot2": hand_dot(tensor_w), "out": OUT_SPEC},
      "mix": functools.partial(jnp.einsum, _dot_general=fp8jax.dot_general_fn(BLOCKWISE))})
  x = x_input()
  quantized = rules_lib.quantize_model(model, NNX_RULES)
  y_rules, g_rules = _logits_and_grads(quantized, x)
  y_hand, g_hand = _logits_and_grads(hand, x)
  assert_same((y_rules, g_rules), (y_hand, g_hand))
  y_plain, _ = _logits_and_grads(model, x)  # the original is untouched, and differs
  assert not np.array_equal(y_plain, y_rules)
  assert jax.tree.structure(nnx.state(quantized)) == jax.tree.structure(nnx.state(model))


@pytest.mark.slow
def test_nnx_unmatched_modules_stay_bit_identical():
  model = Net(nnx.Rngs(0))
  quantized = rules_lib.quantize_model(model, [Rule(r"blocks/1/fc2", BLOCKWISE)])
  x = x_input()
  assert_same(quantized.blocks[0](x), model.blocks[0](x))
  assert_same(quantized.blocks[1].fc1(x), model.blocks[1].fc1(x))
  assert_same(quantized.head(x), model.head(x))
  assert not np.array_equal(quantized.blocks[1](x), model.blocks[1](x))
  y, g = _logits_and_grads(rules_lib.quantize_model(model, [], strict=False), x)
  assert_same((y, g), _logits_and_grads(model, x))


def test_rules_are_hashable_and_jit_does_not_retrace():
  model = Net(nnx.Rngs(0))
  graph, state = nnx.split(model)
  traces = []

  @functools.partial(jax.jit, static_argnums=2)
  def f(state, x, rules):
    traces.append(rules)
    return rules_lib.quantize_model(nnx.merge(graph, state), rules)(x)

  a = Rules([Rule(r"blocks/0/fc1", BLOCKWISE), Rule("head", OUT_SPEC)])
  b = Rules([Rule(r"blocks/0/fc1", recipes.recipe("fp32_blockwise")),
             Rule("head", fp8jax.preset("deepseek_v3"))])
  assert a == b and hash(a) == hash(b) and a is not b
  x = x_input()
  assert_same(f(state, x, a), f(state, x, b))
  assert len(traces) == 1
  f(state, x, Rules([Rule(r"blocks/0/fc1", TENSOR)]))
  assert len(traces) == 2
  g1, _ = nnx.split(rules_lib.quantize_model(model, a))
  g2, _ = nnx.split(rules_lib.quantize_model(model, b))
  assert g1 == g2 and hash(g1) == hash(g2)


class Shared(nnx.Module):
  """One Linear under two attributes."""

  def __init__(self, rngs):
    self.first = nnx.Linear(4, 4, rngs=rngs)
    self.second = self.first
    self.mix = nnx.Einsum("bd,de->be", (4, 4), rngs=rngs)


def test_module_paths_list_each_module_once_under_its_first_path_with_its_hooks():
  model = Shared(nnx.Rngs(0))
  paths = nnx_apply.module_paths(model)
  assert paths == {"": model, "first": model.first, "mix": model.mix}
  assert {p: nnx_apply.module_ops(m) for p, m in paths.items()} == {
      "": (), "first": ("dot_general",), "mix": ("einsum",)}


def test_the_copy_carries_the_hooks_and_the_original_keeps_its_own():
  model = Net(nnx.Rngs(0))
  quantized = nnx_apply.quantize_nnx(model, [Rule("blocks/0/fc1", TENSOR),
                                             Rule("mix", BLOCKWISE)])
  assert quantized.blocks[0].fc1.dot_general == ops_lib.QuantDotGeneral(TENSOR, "blocks/0/fc1")
  assert quantized.mix.einsum_op == ops_lib.QuantEinsum(BLOCKWISE, "mix")
  assert model.blocks[0].fc1.dot_general is jax.lax.dot_general
  assert model.mix.einsum_op is jnp.einsum
  assert quantized.blocks[1].fc1.dot_general is jax.lax.dot_general  # unmatched
  assert quantized.head.kernel[...] is model.head.kernel[...]  # the parameters are shared


def test_an_output_rule_fake_quantizes_the_modules_result_in_a_subclass():
  model = Net(nnx.Rngs(0))
  quantized = nnx_apply.quantize_nnx(model, [Rule("head", OUT_SPEC)])
  x = x_input((2, 4, 32))
  plain = np.asarray(model.head(x))
  np.testing.assert_array_equal(np.asarray(quantized.head(x)), ref_for_spec(plain, OUT_SPEC)[2])
  cls = type(quantized.head)
  assert cls is not nnx.Linear and issubclass(cls, nnx.Linear)
  assert cls.__name__ == "Linear" and type(model.head) is nnx.Linear
  again = nnx_apply.quantize_nnx(quantized, [Rule("head", W_SPEC)])  # no subclass of it
  assert type(again.head) is cls and cls.__mro__[1] is nnx.Linear


def test_an_output_rule_on_a_module_that_is_not_called_matches_nothing():
  """``blocks`` is an ``nnx.List``: no ``__call__`` output to quantize."""
  model = Net(nnx.Rngs(0))
  plans = nnx_apply.plans(model, [Rule("blocks", OUT_SPEC), Rule("blocks/0", OUT_SPEC)])
  assert plans["blocks"].output is None and plans["blocks"].matched == ()
  assert plans["blocks/0"].output is OUT_SPEC
  with pytest.raises(ValueError, match=r"^rule 'blocks', role output \(rules\[0\]\) matches no "
                                       r"module of the Net model that is called: it matches "
                                       r"'blocks', which has no __call__ output to quantize$"):
    nnx_apply.quantize_nnx(model, [Rule("blocks", OUT_SPEC)])
  assert isinstance(nnx_apply.quantize_nnx(model, [Rule("blocks", OUT_SPEC)], strict=False)
                    .blocks[0], Block)


def test_a_model_that_is_no_nnx_module_is_refused():
  with pytest.raises(TypeError, match=r"quantize_nnx: model must be an nnx.Module, got dict"):
    rules_lib.quantize_model({"w": jnp.ones(3)}, [Rule(".*", TENSOR)])
