"""Rules on a Linen model through `intercept` (fp8jax.rules.linen_apply): equal to fp8jax ops
placed by hand, unmatched modules untouched, and a rule that matched no module refused."""

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.rules import Rule, Rules, linen_apply
from tests.helpers import ref_for_spec
from tests.rules.conftest import (
  BLOCKWISE,
  OUT_SPEC,
  TENSOR,
  LinenMLP,
  assert_same,
  hand_dot,
  x_input,
)

LINEN_RULES = Rules([Rule(r"fc\d_(in|out)", TENSOR), Rule(r"fc0_in", BLOCKWISE),
                     Rule(r"head", OUT_SPEC)])


def _linen_logits_and_grads(model, params, x, rules=None):
  def loss(p):
    if rules is None:
      y = model.apply(p, x)
    else:
      with rules_lib.intercept(rules):
        y = model.apply(p, x)
    return jnp.sum(jnp.sin(y)), y

  (_, y), g = jax.value_and_grad(loss, has_aux=True)(params)
  return y, g


@pytest.mark.slow
def test_linen_rules_equal_hand_placed_ops_bit_for_bit():
  x = x_input()
  params = LinenMLP().init(jax.random.key(0), x)
  y_rules, g_rules = _linen_logits_and_grads(LinenMLP(), params, x, LINEN_RULES)
  hand = LinenMLP(hand=(("fc0_in", hand_dot(BLOCKWISE)), ("fc0_out", hand_dot(TENSOR)),
                        ("fc1_in", hand_dot(TENSOR)), ("fc1_out", hand_dot(TENSOR))))

  def hand_loss(p):  # the head's output rule: fake_quant after the hand model
    y = fp8jax.fake_quant(hand.apply(p, x), OUT_SPEC)
    return jnp.sum(jnp.sin(y)), y
  (_, y_hand), g_hand = jax.value_and_grad(hand_loss, has_aux=True)(params)
  assert_same((y_rules, g_rules), (y_hand, g_hand))
  y_plain, _ = _linen_logits_and_grads(LinenMLP(), params, x)
  assert not np.array_equal(y_plain, y_rules)


@pytest.mark.slow
def test_linen_unmatched_paths_and_no_rules_stay_bit_identical():
  x = x_input()
  model = LinenMLP()
  params = model.init(jax.random.key(0), x)
  assert_same(_linen_logits_and_grads(model, params, x, Rules()),
              _linen_logits_and_grads(model, params, x))
  with rules_lib.intercept([Rule("fc1_out", BLOCKWISE)]) as seen:
    _, state = model.apply(params, x, capture_intermediates=True, mutable=["intermediates"])
  _, plain = model.apply(params, x, capture_intermediates=True, mutable=["intermediates"])
  got, want = state["intermediates"], plain["intermediates"]
  for name in ("fc0_in", "fc0_out", "fc1_in"):
    assert_same(got[name], want[name])
  assert not np.array_equal(got["fc1_out"]["__call__"][0], want["fc1_out"]["__call__"][0])
  assert [p for p, plan in seen.plans.items() if not plan.empty] == ["fc1_out"]
  text = rules_lib.describe(model, Rules((*LINEN_RULES, Rule("fc2_in", TENSOR))), x)
  lines = text.splitlines()
  assert "fc0_in/kernel  dot_general [2,8,32]x[32,64]  recipe fp32_blockwise  (rules 0, 1)" in lines
  assert "head/kernel  dot_general [2,8,32]x[32,8]  not quantized: no rule" in lines
  assert lines[-3].startswith("head  output [2,8,8]  e4m3 1x128@-1 current fp32 | bwd e4m3")
  assert lines[-1] == "unmatched: rules[3] rule 'fc2_in', role gemm"
  with pytest.raises(ValueError, match=r"rule 'fc2_in', role gemm \(rules\[3\]\) matches no"):
    rules_lib.check_linen(model, Rules((*LINEN_RULES, Rule("fc2_in", TENSOR))), x)


def test_intercept_refuses_a_rule_that_matched_no_module_called_in_the_block():
  """A typo raises at the end of the block, naming the rule and the closest paths; so does
  a block in which no module ran (a jitted function replaying its cached trace). The model
  runs abstractly (``jax.eval_shape``): the modules are called, nothing compiles."""
  x = x_input()
  model = LinenMLP()
  params = model.init(jax.random.key(0), x)
  with pytest.raises(ValueError, match=r"^rule 'fc0_inn', role gemm \(rules\[1\]\) matches "
                                       r"no module of the intercept block that has a matmul "
                                       r"hook; closest: 'fc0_in', "):
    with rules_lib.intercept([Rule("fc0_in", TENSOR), Rule("fc0_inn", TENSOR)]):
      jax.eval_shape(model.apply, params, x)
  with pytest.raises(ValueError, match=r"intercept: no Linen module ran inside the block"):
    with rules_lib.intercept([Rule("fc0_in", TENSOR)]):
      pass
  with rules_lib.intercept([Rule("fc0_inn", TENSOR)], strict=False) as seen:
    jax.eval_shape(model.apply, params, x)  # strict=False: a block that runs part of a model
  assert "fc0_in" in seen.plans


class Inner(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(16, name="fc")(x)


class Outer(nn.Module):
  """A nested model with a second method, ``encode``, that calls the same submodule."""

  def setup(self):
    self.inner = Inner()

  def __call__(self, x):
    return self.inner(x) * 2.0

  def encode(self, x):
    return self.inner(x) * 2.0


def test_linen_plans_name_nested_modules_by_their_joined_path():
  x = jnp.ones((2, 8), jnp.float32)  # traced abstractly: nothing is computed
  found = linen_apply.check_linen(Outer(), [Rule("inner/fc", TENSOR), Rule("inner", OUT_SPEC)],
                                  x)
  assert set(found) == {"", "inner", "inner/fc"}
  assert found["inner/fc"].gemm == (("dot_general", TENSOR),) and found["inner/fc"].matched == (0,)
  assert found["inner"].output is OUT_SPEC and found["inner"].ops == ()
  assert found[""].empty
  with pytest.raises(ValueError, match=r"^rule 'outer/fc', role gemm \(rules\[0\]\) matches no "
                                       r"module of the Outer model that has a matmul hook; "
                                       r"closest: 'inner/fc'"):
    linen_apply.check_linen(Outer(), [Rule("outer/fc", TENSOR)], x)


def test_linen_plans_take_abstract_inputs_and_flags_as_given():
  rules = [Rule("inner/fc", TENSOR), Rule("inner", OUT_SPEC)]
  concrete = linen_apply.linen_plans(Outer(), rules, jnp.ones((2, 8), jnp.float32))
  abstract = linen_apply.check_linen(Outer(), rules, jax.ShapeDtypeStruct((2, 8), jnp.float32))
  assert abstract == concrete and abstract["inner/fc"].gemm == (("dot_general", TENSOR),)

  class Flagged(nn.Module):  # a Python flag steers the trace: it must not become a tracer
    @nn.compact
    def __call__(self, x, use_head: bool):
      x = nn.Dense(4, name="body")(x)
      return nn.Dense(2, name="head")(x) if use_head else x

  x = jax.ShapeDtypeStruct((2, 8), jnp.float32)
  assert "head" in linen_apply.linen_plans(Flagged(), rules, x, use_head=True)
  assert "head" not in linen_apply.linen_plans(Flagged(), rules, x, False)


def test_an_output_rule_quantizes_the_result_of_call_only():
  rng = np.random.default_rng(2)  # NumPy's: jax.random compiles a sampler per shape
  x = jnp.asarray(rng.standard_normal((2, 8)), jnp.float32)
  params = {"params": {"inner": {"fc": {"kernel": jnp.asarray(rng.standard_normal((8, 16)),
                                                              jnp.float32),
                                        "bias": jnp.zeros(16, jnp.float32)}}}}
  model = Outer()

  def run(p, x, method="__call__"):
    with linen_apply.intercept([Rule("", OUT_SPEC)]):
      return model.apply(p, x, method=method)
  plain = np.asarray(model.apply(params, x))
  y = np.asarray(jax.jit(run)(params, x))
  np.testing.assert_array_equal(y, ref_for_spec(plain, OUT_SPEC)[2])
  assert not np.array_equal(y, plain)
  np.testing.assert_array_equal(np.asarray(run(params, x, "encode")), plain)
