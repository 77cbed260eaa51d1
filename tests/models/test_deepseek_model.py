"""DeepSeek-MoE as an api.Model (fp8jax.models.deepseek_model): its options, its FLOP count
on the tiny config worked by hand, and the records and meta entries of its policies."""

import dataclasses

import jax
import optax
import pytest

import fp8jax
from fp8jax.models import api, config, deepseek_model, policy_rules
from fp8jax.models import policy as policy_lib
from fp8jax.rules import Rules
from fp8jax.train import step as step_lib

# The tiny config: vocab 320, d 64, 3 layers (layer 0 dense, 1-2 MoE), 4 heads of 16,
# dense MLP 96, experts 32 wide, 8 routed (2 per token) and 1 shared.
ATTN = 4 * 64 * 64  # q, k, v, o
DENSE_LAYER = ATTN + 3 * 64 * 96  # 34816
MOE_LAYER = ATTN + 8 * 64 + 3 * 64 * 32 + 2 * 3 * 64 * 32  # router, shared, 2 routed: 35328
HEAD = 320 * 64
TINY_MATMUL = DENSE_LAYER + 2 * MOE_LAYER + HEAD  # 125952


def test_options_refuse_an_unknown_moe_kernel_and_too_few_groups():
  with pytest.raises(ValueError, match=r"unknown MoE implementation 'ragged'; use one of "
                                       r"\('dispatch', 'pallas', 'reference'\)"):
    deepseek_model.Options(moe_impl="ragged")
  with pytest.raises(ValueError, match="moe_groups must be >= 1, got 0"):
    deepseek_model.Options(moe_groups=0)
  assert deepseek_model.Options(moe_impl="reference", moe_groups=2).moe_groups == 2


def test_matmul_params_of_the_tiny_config_by_hand():
  assert TINY_MATMUL == 125952
  assert deepseek_model.matmul_params(config.tiny()) == TINY_MATMUL
  # grouped-query attention: k and v shrink to 2 heads of 16 in each of the 3 layers
  gqa = config.tiny(num_key_value_heads=2)
  assert deepseek_model.matmul_params(gqa) == TINY_MATMUL - 3 * 2 * 64 * 2 * 16
  # three routed experts per token: one more expert in each of the 2 MoE layers
  assert deepseek_model.matmul_params(config.tiny(num_experts_per_tok=3)) == (
      TINY_MATMUL + 2 * 3 * 64 * 32)


def test_flops_per_token_are_six_matmul_params_plus_the_attention_core():
  assert deepseek_model.flops_per_token(config.tiny(), 16) == 6 * 125952 + 12 * 3 * 64 * 16
  assert deepseek_model.flops_per_token(config.tiny(), 16) == 792576.0
  assert deepseek_model.flops_per_token(config.tiny(), 1) == 755712.0 + 12 * 3 * 64


def test_the_model_carries_the_config_and_checks_its_policies():
  model = deepseek_model.model(config.tiny())
  assert (model.name, model.vocab_size, model.max_len) == ("deepseek_moe", 320, 128)
  assert model.baseline == deepseek_model.variant(policy_lib.BF16, 3)
  assert model.baseline.source is policy_lib.BF16 and model.baseline.rules == Rules()
  assert model.flops_per_token(16) == 792576.0
  parsed = policy_lib.parse_policy("moe@1-2:e4m3")
  got = model.policy("moe@1-2:e4m3")
  assert isinstance(got, api.Variant) and got.source == parsed
  assert got.rules == policy_rules.policy_rules(parsed, 3)
  assert got.record["cell"] == {"module": "moe", "depth": "l1-2", "format": "e4m3"}
  with pytest.raises(TypeError, match="DeepSeek-MoE takes an api.Variant, got str"):
    model.check("attn@0:e4m3")
  with pytest.raises(ValueError, match="site moe_out does not exist at layer 0, which is a "
                                       "dense layer"):
    model.policy("moe@0:e4m3")
  with pytest.raises(ValueError, match="site attn_out names layer 3 but the model has 3 "
                                       "layers"):
    model.policy("attn@3:e4m3")


@pytest.mark.parametrize("expr, cell", [
    ("attn@0:e4m3", {"module": "attn", "depth": "l0", "format": "e4m3"}),
    ("moe_out@1-2:e5m2/tensor", {"module": "moe", "depth": "l1-2", "format": "e5m2"}),
    ("attn@0,1,2:e5m2", {"module": "attn", "depth": "l0-2", "format": "e5m2"}),
    ("attn@all:e4m3", None),  # every layer, whatever the depth: no cell
    ("mlp@0:e4m3", None),  # not a site of the grid
    ("attn@0:e4m3/channel", None),
    ("attn@0:e4m3/delayed", None),
    ("attn@0:e4m3+gemm:mxfp8", None),
])
def test_site_cell_is_the_grid_cell_of_the_numerics(expr, cell):
  assert deepseek_model.site_cell(policy_lib.parse_policy(expr)) == cell


def test_site_cell_ignores_the_name_of_a_policy_built_in_code():
  spec = fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.per_tensor())
  pol = policy_lib.PrecisionPolicy((policy_lib.SiteRule("moe_out", (1, 2), spec),), "anything")
  assert deepseek_model.site_cell(pol) == {"module": "moe", "depth": "l1-2", "format": "e5m2"}


def test_policy_record_of_a_gemm_control_names_the_recipe_it_controls():
  record = deepseek_model.policy_record(
      policy_lib.parse_policy("noise(gemm:nvfp4_recipe@0-1)"), 3)
  assert record == {
      "version": 1, "name": "noise(gemm:nvfp4_recipe@0-1)",
      "expr": "noise(gemm:nvfp4_recipe@0-1)", "sites": [],
      "gemm": {"recipe": "nvfp4_recipe", "bits": 4, "layers": [0, 1],
               "bf16_layers": [2], "where": None},  # max(1, round(0.16 * 3)) = 1 layer
      "noise": True, "cell": None}


def test_policy_record_of_a_config_no_expression_writes():
  custom = policy_lib.PrecisionPolicy(gemm=fp8jax.GemmConfig(transpose="double"), name="c")
  assert deepseek_model.policy_record(custom, 3) == {
      "version": 1, "name": "c", "expr": None, "sites": [],
      "gemm": {"recipe": None, "bits": 8, "layers": None, "bf16_layers": [], "where": None},
      "noise": False, "cell": None}


def test_policy_meta_of_a_site_policy():
  entry = deepseek_model.policy_meta(policy_lib.parse_policy("moe@2:e5m2"), 3)
  assert entry["expr"] == "moe_out@2:e5m2/tensor" and entry["kind"] == "policy"
  assert "control_of" not in entry
  assert entry["direct"] == [("routed_experts", 2), ("shared_experts", 2)]
  assert entry["record"]["cell"] == {"module": "moe", "depth": "l2", "format": "e5m2"}
  assert entry["record"]["sites"] == [{"site": "moe_out", "layers": [2], "format": "e5m2",
                                       "granularity": "per-tensor", "scaling": "current"}]


def test_policy_meta_of_a_control_names_the_policy_it_controls():
  entry = deepseek_model.policy_meta(policy_lib.parse_policy("noise(attn@0-1:e4m3)"), 3)
  assert (entry["kind"], entry["control_of"]) == ("control", "attn@0-1:e4m3")
  assert entry["expr"] == "noise(attn_out@0-1:e4m3/tensor)"
  assert entry["direct"] == [("attn_o", 0), ("attn_o", 1)]
  assert entry["record"]["noise"] and entry["record"]["cell"] is None


def test_policy_meta_of_a_gemm_recipe_marks_every_linear_module_of_every_layer():
  entry = deepseek_model.policy_meta(policy_lib.parse_policy("gemm:mxfp8"), 3)
  modules = ("attn_k", "attn_o", "attn_q", "attn_v", "dense_mlp", "routed_experts",
             "shared_experts")
  assert entry["direct"] == [(m, i) for m in modules for i in range(3)]
  assert entry["record"]["gemm"]["recipe"] == "mxfp8"


def test_training_takes_the_model_not_its_config():
  """The train step and its init take a :class:`~fp8jax.models.api.Model`, which carries
  its options; a bare ``ModelConfig`` is refused by name."""
  cfg = config.tiny(num_hidden_layers=2)
  tx = optax.adamw(1e-3)
  for make in (step_lib.make_train_step, step_lib.seeded_init):
    with pytest.raises(TypeError, match="fp8jax.models.api.Model .* got ModelConfig"):
      make(cfg, tx)
  with pytest.raises(TypeError, match="moe_impl"):  # its options are the model's own
    step_lib.make_train_step(deepseek_model.model(cfg), tx, moe_impl="pallas")


def test_a_variant_describes_and_records_as_its_precision_policy():
  """model.policy(text) is an api.Variant; its meta entry, checkpoint record, direct
  modules and delayed state are those of the PrecisionPolicy the text parses to (a stray
  PrecisionPolicy is converted); a renamed Variant is described under its new name."""
  model = deepseek_model.model(config.tiny())
  text = "attn@0:e4m3/delayed(h=4)+gemm:fp32_blockwise"
  parsed, got = policy_lib.parse_policy(text), model.policy(text)
  assert model.policy_meta(got) == deepseek_model.policy_meta(parsed, 3)
  assert model.policy_meta(parsed) == model.policy_meta(got)
  assert got.record == deepseek_model.policy_record(parsed, 3)
  assert model.record(got, text) == policy_lib.record(parsed, text)
  assert model.direct(got) == model.direct(parsed) != frozenset()
  assert jax.tree.map(lambda x: x.shape, model.delayed_init(got)) == {
      "attn_out": {0: {"fwd": (4,)}}}
  renamed = dataclasses.replace(got, name="other")
  assert model.policy_meta(renamed)["record"]["name"] == "other"
  control = model.policy("noise(attn@0:e4m3)")
  assert control.control_of == "attn@0:e4m3" and control.record["noise"]
