"""Policy records (fp8jax.models.policy_record): DeepSeek-MoE's policies of every grid,
grid cells under any name, rules policies as text and as code."""

import dataclasses
import json

import pytest

from fp8jax.gemm import recipes
from fp8jax.models import api, deepseek_model, policy_record, rules_policy
from fp8jax.models import policy as policy_lib
from fp8jax.rules import Rule, Rules
from fp8jax.study.comparison import policies

LAYERS = 9


def _record(expr: str, name: str | None = None) -> dict:
  policy = policy_lib.parse_policy(expr)
  return deepseek_model.policy_record(dataclasses.replace(policy, name=name or expr), LAYERS)


def test_site_grid_records_name_their_cells():
  for name, expr in {**policies.site_grid(LAYERS), **policies.delayed_grid(LAYERS)}.items():
    record = policy_record.check(_record(expr, name))
    assert list(record) == list(policy_record.KEYS)
    assert json.loads(json.dumps(record)) == record
    module, depth, fmt, *delayed = name.split("_")
    site = {"attn": "attn_out", "moe": "moe_out"}[module]
    layers = [0] if depth == "l0" else list(range(LAYERS))
    assert record["sites"] == [{"site": site, "layers": layers, "format": fmt,
                                "granularity": "per-tensor",
                                "scaling": "delayed" if delayed else "current"}]
    assert (record["name"], record["gemm"], record["noise"]) == (name, None, False)
    assert record["expr"] == expr.replace(f"{module}@", f"{site}@").replace(
        f":{fmt}", f":{fmt}/tensor")
    want = None if delayed else {"module": module, "depth": depth, "format": fmt}
    assert record["cell"] == want, name


def test_formats_grid_records_name_their_recipes():
  bits = {"fp8_tensor": 8, "fp8_blockwise": 8, "mxfp8": 8, "mxfp4": 4, "nvfp4": 4,
          "nvfp4_recipe": 4}
  for name, expr in policies.formats_grid(LAYERS).items():
    record = _record(expr, name)
    recipe = expr.removeprefix("gemm:")
    assert (record["sites"], record["cell"], record["expr"]) == ([], None, expr)
    assert record["gemm"] == {"recipe": recipe, "bits": bits[name], "layers": None,
                              "bf16_layers": [8] if recipe == "nvfp4_recipe" else [],
                              "where": None}
  tail = _record("gemm:nvfp4_recipe_no_tail")["gemm"]  # the same config, no BF16 layers
  assert (tail["recipe"], tail["bf16_layers"]) == ("nvfp4_recipe_no_tail", [])
  assert _record("gemm:mxfp4@1-2")["gemm"]["layers"] == [1, 2]
  control = _record("noise(gemm:nvfp4_recipe)")
  assert control["noise"] and control["gemm"]["recipe"] == "nvfp4_recipe"
  unknown_depth = deepseek_model.policy_record(policy_lib.parse_policy("gemm:nvfp4_recipe"), None)
  assert unknown_depth["gemm"]["bf16_layers"] is None


def test_an_expression_that_is_a_grid_cell_gets_its_cell_whatever_its_name():
  cell = {"module": "moe", "depth": "l0-8", "format": "e4m3"}
  for expr in ("moe@0-8:e4m3", "moe_out@0-8:e4m3/tensor", "moe_l0-8_e4m3"):
    assert _record(expr, "my policy")["cell"] == cell
  assert _record("moe@1-3:e5m2")["cell"] == {"module": "moe", "depth": "l1-3",
                                             "format": "e5m2"}
  for other in ("moe@0-8:e4m3/1x128", "moe@0,2:e4m3", "moe@0-8:e4m3+attn@0:e4m3",
                "moe@0:e4m3+gemm:mxfp8", "routed@0:e4m3", "noise(moe@0-8:e4m3)", "bf16"):
    assert _record(other)["cell"] is None, other


def test_meta_entries_carry_the_record():
  policy = policy_lib.parse_policy("noise(attn_l0_e4m3)")
  entry = deepseek_model.policy_meta(policy, LAYERS)
  assert set(entry) == {"expr", "direct", "kind", "control_of", "record"}
  assert entry["record"] == deepseek_model.policy_record(policy, LAYERS)
  assert entry["record"]["noise"] and entry["record"]["cell"] is None


def test_rules_policy_text_records_its_recipe_and_sites():
  record = rules_policy.parse("gemm:nvfp4_recipe+output:e4m3@head", 12, "layers/{i}/.*").record
  assert record["gemm"] == {"recipe": "nvfp4_recipe", "bits": 4, "layers": None,
                            "bf16_layers": [10, 11], "where": ".*"}
  assert record["sites"] == [{"site": "head", "layers": None, "format": "e4m3",
                              "granularity": "per-tensor", "scaling": "current"}]
  assert record["cell"] is None and not record["noise"]
  no_tail = rules_policy.parse("gemm:nvfp4_recipe_no_tail@mlp/.*").record["gemm"]
  assert (no_tail["recipe"], no_tail["where"], no_tail["bf16_layers"]) == (
      "nvfp4_recipe_no_tail", "mlp/.*", [])
  changed = rules_policy.parse("gemm:mxfp8+weight:e5m2@head").record["gemm"]
  assert (changed["recipe"], changed["bits"]) == (None, 8)  # not the named recipe any more
  assert rules_policy.parse("bf16").record == policy_record.build("bf16", "bf16")
  variant = rules_policy.parse("gemm:mxfp8")
  assert api.variant_meta(variant)["record"] is variant.record
  assert variant == api.Variant("gemm:mxfp8", variant.rules, "gemm:mxfp8")  # not compared


def test_rules_built_in_code_get_a_record():
  mxfp8 = recipes.recipe("mxfp8")
  record = api.variant_meta(api.Variant("v", Rules([Rule(r"blocks/\d+", mxfp8)])))["record"]
  assert (record["name"], record["expr"]) == ("v", None)
  assert record["gemm"] == {"recipe": "mxfp8", "bits": 8, "layers": None,
                            "bf16_layers": None, "where": r"blocks/\d+"}
  two = policy_record.of_rules("w", Rules([Rule("a", mxfp8), Rule("b", recipes.recipe(
      "mxfp4"))]))
  assert two["gemm"] == {"recipe": None, "bits": None, "layers": None, "bf16_layers": None,
                         "where": None}
  assert policy_record.of_rules("none", Rules([]))["gemm"] is None


def test_records_of_another_version_are_refused():
  with pytest.raises(ValueError, match="here: a policy record of version 2; this code reads "
                                       "version 1"):
    policy_record.check({**policy_record.build("p", None), "version": 2}, "here")
  with pytest.raises(ValueError, match=r"here: the policy record lacks \['cell'\]"):
    policy_record.check({k: v for k, v in policy_record.build("p", None).items()
                         if k != "cell"}, "here")
