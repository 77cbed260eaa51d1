"""Named points (fp8jax/rules/points.py): the rules' answers for paths that are not modules,
a GEMM config per matmul op and an output spec, later rules overriding earlier ones."""

import pytest

import fp8jax
from fp8jax.gemm import recipes
from fp8jax.rules import Rule, Rules, points

BLOCKWISE = recipes.recipe("fp32_blockwise")
TENSOR = recipes.recipe("fp8_tensor")
OUT_SPEC = fp8jax.preset("deepseek_v3")

RULES = Rules([
    Rule(r"layers/\d+/attn/q", TENSOR),
    Rule(r"layers/0/attn/q", BLOCKWISE),                  # overrides the line above
    Rule(r"layers/\d+/mlp", BLOCKWISE, op="ragged_dot"),
    Rule(r"layers/[12]/moe_out", OUT_SPEC),
])


def test_gemm_config_per_path_and_op():
  assert points.gemm_config(RULES, "layers/3/attn/q") == TENSOR
  assert points.gemm_config(RULES, "layers/0/attn/q") == BLOCKWISE
  assert points.gemm_config(RULES, "layers/3/attn/k") is None
  assert points.gemm_config(RULES, "layers/3/attn/q/extra") is None  # a full match only
  assert points.gemm_config(RULES, "layers/3/mlp", op="ragged_dot") == BLOCKWISE
  assert points.gemm_config(RULES, "layers/3/mlp") is None  # the rule is for ragged_dot
  with pytest.raises(ValueError, match="unknown op 'conv'"):
    points.gemm_config(RULES, "layers/3/mlp", op="conv")


def test_output_spec_of_a_named_value():
  assert points.output_spec(RULES, "layers/2/moe_out") == OUT_SPEC
  assert points.output_spec(RULES, "layers/3/moe_out") is None
  assert points.output_spec(RULES, "layers/1/attn/q") is None  # a GEMM rule, no output
  assert points.output_spec(Rule("head", OUT_SPEC), "head") == OUT_SPEC  # one rule
