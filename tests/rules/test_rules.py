"""The rule engine on user models written here: NNX and Linen MLPs, never edited by it."""

import dataclasses
import functools

from flax import linen as nn
from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.gemm import recipes
from fp8jax.rules import Rule, Rules

D, H = 32, 64
BLOCKWISE = recipes.recipe("fp32_blockwise")
TENSOR = recipes.recipe("fp8_tensor")
OUT_SPEC = fp8jax.preset("deepseek_v3")
W_SPEC = fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.per_tensor())
ODD = fp8jax.QuantSpec(granularity=fp8jax.block((2, 2), axes=(-4, -1)))  # fits no 2-3D operand


def _dot(config):
  return functools.partial(fp8jax.fp8_dot_general, config=config)


# --- a user's NNX model; `hand` puts fp8jax ops in by hand at chosen places ------------

class Block(nnx.Module):
  def __init__(self, rngs, dot1=lax.dot_general, dot2=lax.dot_general, out=None):
    self.fc1 = nnx.Linear(D, H, dot_general=dot1, rngs=rngs)
    self.fc2 = nnx.Linear(H, D, dot_general=dot2, rngs=rngs)
    self.out = out

  def __call__(self, x):
    y = x + self.fc2(jax.nn.gelu(self.fc1(x)))
    return y if self.out is None else fp8jax.fake_quant(y, self.out)


class Net(nnx.Module):
  def __init__(self, rngs, hand=None):
    hand = hand or {}
    self.blocks = nnx.List([Block(rngs, **hand.get(i, {})) for i in range(2)])
    self.mix = nnx.Einsum("btd,de->bte", (D, D), rngs=rngs,
                          einsum_op=hand.get("mix", jnp.einsum))
    self.head = nnx.Linear(D, 8, rngs=rngs)

  def __call__(self, x):
    for b in self.blocks:
      x = b(x)
    return self.head(self.mix(x))


def _x(shape=(2, 8, D)):
  # NumPy's normal: jax.random's compiles a sampler per shape
  return jnp.asarray(np.random.default_rng(1).standard_normal(shape), jnp.float32)


def _logits_and_grads(model, x):
  graphdef, state = nnx.split(model)

  def loss(s):
    y = nnx.merge(graphdef, s)(x)
    return jnp.sum(jnp.sin(y)), y

  (_, y), g = jax.value_and_grad(loss, has_aux=True)(state)
  return y, g


def _assert_same(a, b):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


NNX_RULES = Rules([
    Rule(r"blocks/\d+/fc\d", TENSOR),
    Rule(r"blocks/0/fc1", BLOCKWISE),                       # overrides the line above
    Rule(r"blocks/1/fc2", W_SPEC, role="weight"),
    Rule(r"blocks/1", OUT_SPEC),                            # role output (a QuantSpec)
    Rule(r"mix", BLOCKWISE, op="einsum"),
])


@pytest.mark.slow
def test_nnx_rules_equal_hand_placed_ops_bit_for_bit():
  model = Net(nnx.Rngs(0))
  tensor_w = TENSOR.replace(roles=dataclasses.replace(TENSOR.roles, weight=W_SPEC))
  hand = Net(nnx.Rngs(0), hand={
      0: {"dot1": _dot(BLOCKWISE), "dot2": _dot(TENSOR)},
      1: {"dot1": _dot(TENSOR), "dot2": _dot(tensor_w), "out": OUT_SPEC},
      "mix": functools.partial(jnp.einsum, _dot_general=fp8jax.dot_general_fn(BLOCKWISE))})
  x = _x()
  quantized = rules_lib.quantize_model(model, NNX_RULES)
  y_rules, g_rules = _logits_and_grads(quantized, x)
  y_hand, g_hand = _logits_and_grads(hand, x)
  _assert_same((y_rules, g_rules), (y_hand, g_hand))
  y_plain, _ = _logits_and_grads(model, x)  # the original is untouched, and differs
  assert not np.array_equal(y_plain, y_rules)
  assert jax.tree.structure(nnx.state(quantized)) == jax.tree.structure(nnx.state(model))


@pytest.mark.slow
def test_nnx_unmatched_modules_stay_bit_identical():
  model = Net(nnx.Rngs(0))
  quantized = rules_lib.quantize_model(model, [Rule(r"blocks/1/fc2", BLOCKWISE)])
  x = _x()
  _assert_same(quantized.blocks[0](x), model.blocks[0](x))
  _assert_same(quantized.blocks[1].fc1(x), model.blocks[1].fc1(x))
  _assert_same(quantized.head(x), model.head(x))
  assert not np.array_equal(quantized.blocks[1](x), model.blocks[1](x))
  y, g = _logits_and_grads(rules_lib.quantize_model(model, [], strict=False), x)
  _assert_same((y, g), _logits_and_grads(model, x))


def test_describe_lists_paths_actions_and_unmatched_rules():
  model = Net(nnx.Rngs(0))
  text = rules_lib.describe(model, Rules((*NNX_RULES, Rule("nothing/here", BLOCKWISE))))
  lines = text.splitlines()
  assert lines[0] == "blocks/0/fc1  gemm[dot_general]: recipe fp32_blockwise  (rules 0, 1)"
  assert "blocks/1  output: e4m3 1x128@-1 current fp32 | bwd e4m3 1x128@-1" in text
  assert any(ln.startswith("blocks/1/fc2  gemm[dot_general]: fp8/fp8/fp8") for ln in lines)
  assert "mix  gemm[einsum]: recipe fp32_blockwise  (rules 4)" in lines
  assert lines[-2] == "unmatched: rules[5] rule 'nothing/here', role gemm"
  assert lines[-1].startswith("(the hooks set, not traced: describe(model, rules, *example")
  assert not any(ln.startswith("head") for ln in lines)
  undone = rules_lib.describe(model, [Rule(".*", BLOCKWISE), Rule("head", None, role="gemm")])
  assert "head  unquantized  (rules 0, 1)" in undone.splitlines()


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
  x = _x()
  _assert_same(f(state, x, a), f(state, x, b))
  assert len(traces) == 1
  f(state, x, Rules([Rule(r"blocks/0/fc1", TENSOR)]))
  assert len(traces) == 2
  g1, _ = nnx.split(rules_lib.quantize_model(model, a))
  g2, _ = nnx.split(rules_lib.quantize_model(model, b))
  assert g1 == g2 and hash(g1) == hash(g2)


@pytest.mark.parametrize("make, error, message", [
    (lambda: Rule("blocks/(", BLOCKWISE), ValueError, r"rule 'blocks/\(': bad module_path"),
    (lambda: Rule("mix", BLOCKWISE, op="matmul"), ValueError, r"rule 'mix'.*unknown op 'matmul'"),
    (lambda: Rule("mix", OUT_SPEC, role="bias"), ValueError, r"rule 'mix'.*unknown role 'bias'"),
    (lambda: Rule("mix", "e4m3"), TypeError, r"rule 'mix'.*must be a GemmConfig or QuantSpec"),
    (lambda: Rule("mix", BLOCKWISE, role="output"), TypeError,
     r"rule 'mix', role output.*takes a QuantSpec or None action, got GemmConfig"),
    (lambda: Rule("mix", OUT_SPEC, role="gemm"), TypeError, r"rule 'mix', role gemm.*GemmConfig"),
    (lambda: Rule("mix", OUT_SPEC, op="einsum"), ValueError, r"op applies to the GEMM roles"),
    (lambda: Rules([Rule("mix", BLOCKWISE), "head"]), TypeError, r"rules\[1\] is a str"),
])
def test_bad_rules_are_refused_naming_the_rule(make, error, message):
  with pytest.raises(error, match=message):
    make()


def test_delayed_scaling_on_a_module_output_is_refused_naming_the_rule():
  """A module output carries no amax history (named points may: tests/test_policy_rules)."""
  rules = [Rule("head", BLOCKWISE), Rule(r"blocks/\d+", fp8jax.preset("te_hybrid"))]
  with pytest.raises(ValueError, match=r"rule 'blocks/.+', role output \(rules\[1\]\) puts "
                                       r"delayed scaling on the output of module 'blocks/0'"):
    rules_lib.quantize_model(Net(nnx.Rngs(0)), rules)
  with pytest.raises(ValueError, match=r"delayed scaling on the output of module 'fc0_in'"):
    rules_lib.describe(LinenMLP(), [Rule("fc0_in", fp8jax.preset("te_hybrid"))], _x())


def test_rules_that_cannot_apply_are_refused():
  model = Net(nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"^rule 'blocks/2/fc1', role gemm \(rules\[1\]\) "
                                       r"matches no module of the Net model that has a matmul "
                                       r"hook; closest: 'blocks/1/fc1', 'blocks/0/fc1', .* "
                                       r"\(module_path must match a whole '/'-joined path: "
                                       r"re.fullmatch\)$"):
    rules_lib.quantize_model(model, [Rule("head", BLOCKWISE), Rule("blocks/2/fc1", BLOCKWISE)])
  with pytest.raises(ValueError, match=r"closest: 'blocks/0/fc2', 'blocks/1/fc2'"):
    rules_lib.quantize_model(model, [Rule("fc2", BLOCKWISE)])  # re.search would find them
  with pytest.raises(ValueError, match=r"rule 'blocks/1', role gemm \(rules\[0\]\) matches "
                                       r"no module .*: it matches 'blocks/1', which has no "
                                       r"matmul hook .*fp8jax.rules.quantize_gemms"):
    rules_lib.quantize_model(model, [Rule("blocks/1", BLOCKWISE)])
  with pytest.raises(ValueError, match=r"no module .* that has a einsum hook: it matches "
                                       r"'head', which has no einsum hook"):
    rules_lib.quantize_model(model, [Rule("head", BLOCKWISE, op="einsum")])
  with pytest.raises(ValueError, match=r"rule 'head', role weight sets the weight spec of "
                                       r"dot_general at 'head', but no earlier rule"):
    rules_lib.quantize_model(model, [Rule("head", W_SPEC, role="weight")])
  odd = fp8jax.QuantSpec(granularity=fp8jax.block((2, 2), axes=(-4, -1)))
  quantized = rules_lib.quantize_model(model, [Rule("head", odd)])
  with pytest.raises(ValueError, match=r"output rule at 'head': .*needs axis -4"):
    quantized(_x())


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
    quantized(_x())
  params = LinenMLP().init(jax.random.key(0), _x())
  with pytest.raises(ValueError, match=r"^dot_general rule at 'fc0_in': granularity"):
    with rules_lib.intercept([Rule("fc0_in", TENSOR), Rule("fc0_in", ODD, role="weight")]):
      LinenMLP().apply(params, _x())


# --- a user's Linen model -------------------------------------------------------------

class LinenMLP(nn.Module):
  hand: tuple = ()  # ((name, config or spec), ...)

  @nn.compact
  def __call__(self, x):
    hand = dict(self.hand)
    for i in range(2):
      h = nn.Dense(H, name=f"fc{i}_in", dot_general=hand.get(f"fc{i}_in"))(x)
      y = x + nn.Dense(D, name=f"fc{i}_out", dot_general=hand.get(f"fc{i}_out"))(
          jax.nn.gelu(h))
      x = y if f"out{i}" not in hand else fp8jax.fake_quant(y, hand[f"out{i}"])
    return nn.Dense(8, name="head")(x)


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
  x = _x()
  params = LinenMLP().init(jax.random.key(0), x)
  y_rules, g_rules = _linen_logits_and_grads(LinenMLP(), params, x, LINEN_RULES)
  hand = LinenMLP(hand=(("fc0_in", _dot(BLOCKWISE)), ("fc0_out", _dot(TENSOR)),
                        ("fc1_in", _dot(TENSOR)), ("fc1_out", _dot(TENSOR))))

  def hand_loss(p):  # the head's output rule: fake_quant after the hand model
    y = fp8jax.fake_quant(hand.apply(p, x), OUT_SPEC)
    return jnp.sum(jnp.sin(y)), y
  (_, y_hand), g_hand = jax.value_and_grad(hand_loss, has_aux=True)(params)
  _assert_same((y_rules, g_rules), (y_hand, g_hand))
  y_plain, _ = _linen_logits_and_grads(LinenMLP(), params, x)
  assert not np.array_equal(y_plain, y_rules)


@pytest.mark.slow
def test_linen_unmatched_paths_and_no_rules_stay_bit_identical():
  x = _x()
  model = LinenMLP()
  params = model.init(jax.random.key(0), x)
  _assert_same(_linen_logits_and_grads(model, params, x, Rules()),
               _linen_logits_and_grads(model, params, x))
  with rules_lib.intercept([Rule("fc1_out", BLOCKWISE)]) as seen:
    _, state = model.apply(params, x, capture_intermediates=True, mutable=["intermediates"])
  _, plain = model.apply(params, x, capture_intermediates=True, mutable=["intermediates"])
  got, want = state["intermediates"], plain["intermediates"]
  for name in ("fc0_in", "fc0_out", "fc1_in"):
    _assert_same(got[name], want[name])
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
  x = _x()
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


class Experts(nnx.Module):
  """A user MoE layer calling its ``ragged_dot`` hook: x [N, K], w [E, K, F]."""

  def __init__(self, rngs, ragged_dot=lax.ragged_dot):
    self.w = nnx.Param(jax.random.normal(rngs.params(), (2, D, 16)))
    self.ragged_dot = ragged_dot

  def __call__(self, x, group_sizes):
    return self.ragged_dot(x, self.w[...], group_sizes)


@pytest.mark.slow
def test_ragged_dot_rules_route_through_the_grouped_gemm():
  x, sizes = _x((24, D)), jnp.array([10, 14], jnp.int32)
  hand = Experts(nnx.Rngs(0), functools.partial(fp8jax.gemm.grouped.fp8_ragged_dot,
                                                config=BLOCKWISE))
  quantized = rules_lib.quantize_model(Experts(nnx.Rngs(0)),
                                       [Rule("", BLOCKWISE, op="ragged_dot")])
  grad = lambda m: jax.value_and_grad(lambda x: jnp.sum(jnp.sin(m(x, sizes))))(x)  # noqa: E731
  _assert_same(grad(quantized), grad(hand))
  assert not np.array_equal(Experts(nnx.Rngs(0))(x, sizes), quantized(x, sizes))
