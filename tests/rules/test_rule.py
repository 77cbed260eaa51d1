"""`Rule` and `Rules` (fp8jax.rules.rule): validation, folding the rules of one module into
a `Plan` (later rules override earlier ones), and the errors naming a rule that cannot act."""

import dataclasses

from flax import nnx
import pytest

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.rules import Rule, Rules
from fp8jax.rules import rule as rule_lib
from tests.rules.conftest import BLOCKWISE, OUT_SPEC, TENSOR, W_SPEC, LinenMLP, Net, x_input

DELAYED_BWD = fp8jax.QuantSpec(granularity=fp8jax.per_tensor(), backward=fp8jax.QuantSpec(
    granularity=fp8jax.per_tensor(), scaling="delayed"))
"""Current scaling forward, delayed scaling on the cotangent."""


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
    (lambda: Rule(3, BLOCKWISE), TypeError, r"rule 3.*module_path must be a regex string, "
     r"got int"),
    (lambda: Rule("mix", None, role="weight"), TypeError,
     r"rule 'mix', role weight: role 'weight' takes a QuantSpec action, got NoneType"),
    (lambda: Rule("mix", None), TypeError, r"action must be a GemmConfig or QuantSpec \(or "
     r"None with an explicit role\), got NoneType"),
])
def test_bad_rules_are_refused_naming_the_rule(make, error, message):
  with pytest.raises(error, match=message):
    make()


def test_the_role_follows_the_action_and_the_label_names_role_and_op():
  assert Rule("a", TENSOR).role == "gemm" and Rule("a", OUT_SPEC).role == "output"
  assert Rule("a", W_SPEC, role="weight").role == "weight"
  assert Rule(r"a/\d+", TENSOR, op="einsum").label() == r"rule 'a/\\d+', role gemm, op einsum"
  assert Rule("head", None, role="gemm").describe() == "gemm: none"
  assert Rule("head", W_SPEC).describe() == "output: e5m2 per-tensor current fp32"
  assert Rule("a", None, role="dgrad_weight").action is None  # a copy role may undo


def test_a_module_path_must_match_the_whole_path():
  rule = Rule(r"fc\d", TENSOR)
  assert rule.matches("fc1") and rule.matches("fc2")
  assert not rule.matches("blocks/0/fc1") and not rule.matches("fc1/kernel")
  assert Rule("", TENSOR).matches("") and not Rule("", TENSOR).matches("head")


def test_as_rules_takes_rules_one_rule_or_a_sequence_and_refuses_text():
  one = Rule("a", TENSOR)
  rules = Rules([one])
  assert rule_lib.as_rules(rules) is rules
  assert rule_lib.as_rules(one) == rules == rule_lib.as_rules([one]) == rule_lib.as_rules((one,))
  assert len(rules) == 1 and rules[0] is one and list(rules) == [one]
  for bad in ("a", b"a", 3):
    with pytest.raises(TypeError, match=r"rules must be fp8jax.rules.Rules or a sequence of "
                                        rf"Rule, got {type(bad).__name__}"):
      rule_lib.as_rules(bad)


def test_later_rules_override_earlier_ones_and_none_undoes_per_op():
  rules = Rules([Rule("a/.*", TENSOR), Rule("a/b", BLOCKWISE),
                 Rule("a/b", None, role="gemm", op="einsum"), Rule("a/c", OUT_SPEC)])
  plan = rule_lib.resolve(rules, "a/b", ("dot_general", "einsum"))
  assert plan.gemm == (("dot_general", BLOCKWISE),)  # einsum: set by 0, 1, undone by 2
  assert plan.config("dot_general") is BLOCKWISE and plan.config("einsum") is None
  assert plan.matched == (0, 1, 2) and plan.output is None and not plan.empty
  assert plan.ops == ("dot_general", "einsum")
  other = rule_lib.resolve(rules, "a/c", ("dot_general",))
  assert other.gemm == (("dot_general", TENSOR),) and other.output is OUT_SPEC
  assert other.matched == (0, 3)
  assert rule_lib.resolve(rules, "x", ("dot_general",)) == rule_lib.Plan(ops=("dot_general",))
  assert rule_lib.resolve(rules, "x", ()).empty


def test_a_gemm_rule_skips_modules_without_its_op_and_an_output_rule_takes_any_module():
  rules = Rules([Rule(".*", TENSOR), Rule(".*", BLOCKWISE, op="einsum"), Rule("blk", OUT_SPEC)])
  container = rule_lib.resolve(rules, "blk", ())
  assert container.gemm == () and container.matched == (2,) and container.output is OUT_SPEC
  dense = rule_lib.resolve(rules, "fc", ("dot_general",))
  assert dense.gemm == (("dot_general", TENSOR),) and dense.matched == (0,)
  both = rule_lib.resolve(rules, "mix", ("dot_general", "einsum"))
  assert dict(both.gemm) == {"dot_general": TENSOR, "einsum": BLOCKWISE}


def test_an_alias_matches_like_the_path():
  """The jaxpr route passes a GEMM's full parameter path (``attn/wq``) as an alias."""
  rules = Rules([Rule("attn/wq", TENSOR)])
  assert rule_lib.resolve(rules, "attn", ("dot_general",)).empty
  plan = rule_lib.resolve(rules, "attn", ("dot_general",), aliases=("attn/wq",))
  assert plan.config("dot_general") is TENSOR and plan.matched == (0,)


def test_operand_rules_refine_the_config_an_earlier_rule_gave():
  rules = Rules([Rule("a", TENSOR), Rule("a", W_SPEC, role="weight"),
                 Rule("a", OUT_SPEC, role="dgrad_weight")])
  config = rule_lib.resolve(rules, "a", ("dot_general",)).config("dot_general")
  assert config.roles == dataclasses.replace(TENSOR.roles, weight=W_SPEC,
                                             dgrad_weight=OUT_SPEC)
  assert config.replace(roles=TENSOR.roles) == TENSOR  # nothing else changed
  with pytest.raises(ValueError, match=r"^rule 'a', role grad sets the grad spec of einsum at "
                                       r"'a', but no earlier rule gives that GEMM a config"):
    rule_lib.resolve(Rules([Rule("a", TENSOR, op="dot_general"), Rule("a", W_SPEC, role="grad")]),
                     "a", ("dot_general", "einsum"))


def test_check_stateless_refuses_delayed_scaling_on_an_output_only_without_state():
  """Forward or cotangent delayed; the last output rule decides and is named (running
  with histories: tests/rules/test_delayed_outputs.py)."""
  for spec in (fp8jax.preset("te_hybrid"), DELAYED_BWD):
    rules = Rules([Rule("a", OUT_SPEC), Rule("a", spec), Rule("a", TENSOR)])
    plan = rule_lib.resolve(rules, "a", ("dot_general",))
    with pytest.raises(ValueError, match=r"^rule 'a', role output \(rules\[1\]\) puts delayed "
                                         r"scaling on the output of module 'a', and no amax "
                                         r"histories are given: run the model inside "
                                         r"fp8jax.rules.delayed_scope\(state\)"):
      rule_lib.check_stateless(rules, "a", plan)
    rule_lib.check_stateless(rules, "a", plan, state_given=True)
  current = Rules([Rule("a", fp8jax.preset("te_hybrid")), Rule("a", OUT_SPEC)])
  rule_lib.check_stateless(current, "a", rule_lib.resolve(current, "a", ()))  # the last wins


def test_delayed_scaling_on_a_module_output_needs_histories_when_it_runs():
  rules = [Rule("head", BLOCKWISE), Rule(r"blocks/\d+", fp8jax.preset("te_hybrid"))]
  net = rules_lib.quantize_model(Net(nnx.Rngs(0)), rules)  # quantizing needs no state
  with pytest.raises(ValueError, match=r"rule 'blocks/.+', role output \(rules\[1\]\) puts "
                                       r"delayed scaling on the output of module 'blocks/0'"):
    net(x_input())
  described = rules_lib.describe(LinenMLP(), [Rule("fc0_in", fp8jax.preset("te_hybrid"))],
                                 x_input())  # an abstract trace, with empty histories
  assert "fc0_in  output [2,8,64]  e4m3 per-tensor delayed" in described


PATHS = ["blocks/0/fc1", "blocks/0/fc2", "blocks/1/fc1", "blocks/1/fc2", "head", "mix"]


def test_closest_paths_puts_partial_matches_first_then_similar_text():
  # re.search hits (not whole-path matches), in path order; difflib's ratio of 'fc2' to
  # 'blocks/0/fc1' is 4/15, under its cutoff 0.4
  assert rule_lib.closest_paths("fc2", PATHS) == ["blocks/0/fc2", "blocks/1/fc2"]
  # difflib ratio of 'blocks/2/fc1': 22/24 for blocks/{0,1}/fc1 (ties: the larger string
  # first), 20/24 for blocks/{0,1}/fc2
  assert rule_lib.closest_paths("blocks/2/fc1", PATHS, n=3) == [
      "blocks/1/fc1", "blocks/0/fc1", "blocks/1/fc2"]
  assert rule_lib.closest_paths("zzzz", PATHS) == []


def test_no_match_error_names_the_rule_and_the_closest_or_the_paths_there_are():
  rule = Rule("zzzz", TENSOR)
  none_close = rule_lib.no_match_error(rule, 2, "module", ["a", "b", "c", "d"])
  assert str(none_close) == ("rule 'zzzz', role gemm (rules[2]) matches no module; none is "
                             "close among 'a', 'b', 'c' (+1 more) (module_path must match a "
                             "whole '/'-joined path: re.fullmatch)")
  assert str(rule_lib.no_match_error(rule, 0, "thing", [])).startswith(
      "rule 'zzzz', role gemm (rules[0]) matches no thing; there is none (")
  wide = Rule(r"b/\d", TENSOR)
  hits = rule_lib.no_match_error(wide, 1, "hooked module", [], [f"b/{i}" for i in range(5)],
                                 "has no hook")
  assert str(hits) == ("rule 'b/\\\\d', role gemm (rules[1]) matches no hooked module: it "
                       "matches 'b/0', 'b/1', 'b/2' (+2 more), which has no hook")


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
