"""The rule engine's entry points (fp8jax.rules.api): `plans` of NNX and Linen models, the
static `describe` report, and the TypeErrors for models each entry point does not take."""

import dataclasses

from flax import nnx
import pytest

from fp8jax import rules as rules_lib
from fp8jax.rules import Rule, Rules
from tests.rules.conftest import (
  BLOCKWISE,
  NNX_RULES,
  OUT_SPEC,
  TENSOR,
  W_SPEC,
  LinenMLP,
  Net,
  x_input,
)


def test_plans_of_an_nnx_model_give_each_module_what_its_rules_fold_to():
  found = rules_lib.plans(Net(nnx.Rngs(0)), NNX_RULES)
  assert set(found) == {"", "blocks", "blocks/0", "blocks/1", "blocks/0/fc1", "blocks/0/fc2",
                        "blocks/1/fc1", "blocks/1/fc2", "mix", "head"}
  gemms = {p: dict(plan.gemm) for p, plan in found.items() if plan.gemm}
  tensor_w = TENSOR.replace(roles=dataclasses.replace(TENSOR.roles, weight=W_SPEC))
  assert gemms == {"blocks/0/fc1": {"dot_general": BLOCKWISE},
                   "blocks/0/fc2": {"dot_general": TENSOR},
                   "blocks/1/fc1": {"dot_general": TENSOR},
                   "blocks/1/fc2": {"dot_general": tensor_w},
                   "mix": {"einsum": BLOCKWISE}}
  assert {p for p, plan in found.items() if plan.output is not None} == {"blocks/1"}
  assert found["blocks/0/fc1"].matched == (0, 1) and found["head"].empty


def test_plans_of_a_linen_model_come_from_a_trace_on_example_inputs():
  found = rules_lib.plans(LinenMLP(), [Rule("fc0_in", TENSOR), Rule("head", OUT_SPEC)],
                          x_input())
  assert set(found) == {"", "fc0_in", "fc0_out", "fc1_in", "fc1_out", "head"}
  assert found["fc0_in"].gemm == (("dot_general", TENSOR),)
  assert found["head"].output is OUT_SPEC and found["head"].gemm == ()
  assert found["fc1_out"].ops == ("dot_general",) and found["fc1_out"].empty


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


def test_the_static_report_names_the_root_module():
  text = rules_lib.describe(Net(nnx.Rngs(0)), [Rule("", OUT_SPEC)])
  assert text.splitlines()[0] == ("<root>  output: e4m3 1x128@-1 current fp32 | bwd e4m3 "
                                  "1x128@-1 current fp32  (rules 0)")


def test_models_an_entry_point_cannot_take_are_refused_saying_what_to_do():
  rules = [Rule("fc0_in", TENSOR)]
  with pytest.raises(TypeError, match=r"quantize_model: Linen modules are quantized at apply "
                                      r"time: call model.apply\(...\) inside `with "
                                      r"fp8jax.rules.intercept\(rules\):`"):
    rules_lib.quantize_model(LinenMLP(), rules)
  for call in (lambda: rules_lib.plans(LinenMLP(), rules),
               lambda: rules_lib.describe(LinenMLP(), rules)):
    with pytest.raises(TypeError, match=r"describe/plans of a Linen model need example inputs: "
                                        r"its modules exist only while it runs"):
      call()
  with pytest.raises(TypeError, match=r"describe of a function needs its example inputs, "
                                      r"fn\(params, \*inputs\)"):
    rules_lib.describe(lambda params, x: x @ params["w"], rules)
  for call in (lambda: rules_lib.plans(3, rules), lambda: rules_lib.describe(3, rules)):
    with pytest.raises(TypeError, match=r"expected a Flax NNX or Linen module, got int"):
      call()
