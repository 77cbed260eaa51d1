"""The fifth question's policies come from the policy records: a named recipe on every
linear layer and nothing else, whatever the policy's name (end to end:
tests/study/comparison/test_sweep.py)."""

from fp8jax.models import api, deepseek_model, rules_policy
from fp8jax.models import policy as policy_lib
from fp8jax.study.common import results
from fp8jax.study.comparison import format_width


def test_recipes_and_bits_come_from_the_records():
  meta = {"model": {"num_hidden_layers": 4}, "policies": {}}
  for name, expr in (("wide", "gemm:fp32_blockwise"), ("narrow", "gemm:nvfp4_recipe"),
                     ("sited", "gemm:mxfp8+attn@0:e4m3"), ("some_layers", "gemm:mxfp4@0-1"),
                     ("gemm:nvfp4", "moe@0:e5m2"), ("noise(wide)", "noise(gemm:fp32_blockwise)")):
    meta["policies"][name] = deepseek_model.policy_meta(policy_lib.parse_policy(expr), 4)
  meta["policies"]["noise(wide)"]["control_of"] = "wide"
  meta["policies"]["rules"] = api.variant_meta(rules_policy.parse("gemm:mxfp8", 4, "{i}"))
  meta["policies"]["mlp_only"] = api.variant_meta(rules_policy.parse(r"gemm:mxfp4@mlp/.*"))
  meta["policies"]["old"] = {"expr": "gemm:mxfp4"}  # written before records
  res = results.Results(None, meta, [], [], [], [])
  assert format_width.format_policies(res) == [
      {"policy": "wide", "recipe": "fp32_blockwise", "bits": 8},
      {"policy": "rules", "recipe": "mxfp8", "bits": 8},
      {"policy": "old", "recipe": "mxfp4", "bits": 4},
      {"policy": "narrow", "recipe": "nvfp4_recipe", "bits": 4}]
