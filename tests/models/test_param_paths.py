"""DeepSeek-MoE's parameter paths (``fp8jax.models.param_paths``): the module, group and
layer of each path of the tiny model's tree and of hand-written ones, and the
``(module, layer)`` pairs a policy quantizes directly."""

import types

import jax
import pytest

import fp8jax
from fp8jax import metrics
from fp8jax.models import config as mc
from fp8jax.models import deepseek_moe as dm
from fp8jax.models import param_paths
from fp8jax.models import policy as pl


def test_paths_of_the_tiny_model_tree():
  cfg = mc.tiny()
  flat = metrics.flatten(dm.abstract_params(cfg))
  assert "layers/1/mlp/experts_gate" in flat and "lm_head/kernel" in flat
  modules = {p: param_paths.module_of(p) for p in flat}
  assert "other" not in modules.values()
  assert set(modules.values()) == set(param_paths.MODULES) - {"other"}
  assert modules["layers/0/mlp/gate_proj/kernel"] == "dense_mlp"
  assert modules["layers/2/mlp/gate"] == "router"
  assert modules["layers/2/mlp/shared_experts/up_proj/kernel"] == "shared_experts"
  assert modules["layers/1/self_attn/o_proj/kernel"] == "attn_o"
  assert modules["layers/1/post_attention_layernorm/weight"] == "norms"
  assert modules["norm/weight"] == "norms" and modules["embed_tokens/embedding"] == "embedding"
  assert param_paths.layer_of("layers/2/mlp/experts_up") == 2
  assert param_paths.layer_of("lm_head/kernel") is None
  assert param_paths.group_of("attn_v") == "attention"
  assert param_paths.group_of("router") == "moe"


@pytest.mark.parametrize("path, module, layer", [
    ("embed_tokens/embedding", "embedding", None), ("lm_head/kernel", "head", None),
    ("norm/weight", "norms", None), ("layers/0/input_layernorm/weight", "norms", 0),
    ("layers/12/self_attn/q_proj/kernel", "attn_q", 12),
    ("layers/1/self_attn/k_proj/kernel", "attn_k", 1),
    ("layers/1/self_attn/v_proj/kernel", "attn_v", 1),
    ("layers/0/mlp/down_proj/kernel", "dense_mlp", 0),
    ("layers/3/mlp/experts_down", "routed_experts", 3),
    ("layers/3/mlp/shared_experts/gate_proj/kernel", "shared_experts", 3),
    ("layers/3/mlp/gate", "router", 3),
    # unknown paths: "other", with the layer where the path names one
    ("layers/1/self_attn/rotary/inv_freq", "other", 1), ("layers/1/self_attn", "other", 1),
    ("layers/2/mlp/bias", "other", 2), ("layers/2", "other", 2),
    ("layers/x/mlp/gate", "other", None), ("encoder/layers/1/mlp/gate", "other", None),
])
def test_a_path_names_its_module_and_layer(path, module, layer):
  assert (param_paths.module_of(path), param_paths.layer_of(path)) == (module, layer)
  assert param_paths.is_expert_stack(path) is (module == "routed_experts")


def test_a_jax_key_path_reads_as_its_slash_joined_string():
  tree = {"layers": {7: {"mlp": {"experts_up": 0, "shared_experts": {"up_proj": 0}}}}}
  key_paths = [kp for kp, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  assert [(param_paths.module_of(kp), param_paths.layer_of(kp)) for kp in key_paths] == [
      ("routed_experts", 7), ("shared_experts", 7)]


def test_modules_fall_into_their_coarse_groups():
  groups = {m: param_paths.group_of(m) for m in param_paths.MODULES}
  assert groups == {"embedding": "other", "attn_q": "attention", "attn_k": "attention",
                    "attn_v": "attention", "attn_o": "attention", "router": "moe",
                    "routed_experts": "moe", "shared_experts": "moe",
                    "dense_mlp": "dense_mlp", "norms": "other", "head": "other",
                    "other": "other"}
  assert param_paths.group_of("no_such_module") == "other"


def test_direct_modules_of_site_policies_and_of_a_gemm_policy():
  spec = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.per_tensor())
  assert param_paths.direct_modules(pl.site_policy("attn_out", "0-1", spec), 3) == {
      ("attn_o", 0), ("attn_o", 1)}
  moe = param_paths.direct_modules(pl.site_policy("moe_out", "all", spec), 2)
  assert moe == {(m, i) for m in ("routed_experts", "shared_experts") for i in (0, 1)}
  gemm = param_paths.direct_modules(types.SimpleNamespace(rules=(), gemm=object()), 1)
  assert ("attn_q", 0) in gemm and ("router", 0) not in gemm


def test_direct_modules_take_a_given_site_map_and_mark_every_gemm_module_of_every_layer():
  rule = lambda site, layers: types.SimpleNamespace(site=site, layers=layers)  # noqa: E731
  policy = types.SimpleNamespace(rules=(rule("a", (0, 2)), rule("b", None), rule("c", (1,))),
                                 gemm=None)
  sites = {"a": ("m1", "m2"), "b": ("m3",)}  # "c": no modules
  assert param_paths.direct_modules(policy, 3, sites) == {
      ("m1", 0), ("m1", 2), ("m2", 0), ("m2", 2), ("m3", 0), ("m3", 1), ("m3", 2)}
  assert param_paths.direct_modules(policy, 3) == frozenset()  # no site_modules: none
  gemm = param_paths.direct_modules(types.SimpleNamespace(rules=(), gemm="fp8"), 2)
  assert gemm == {(m, i) for m in ("attn_q", "attn_k", "attn_v", "attn_o", "dense_mlp",
                                   "shared_experts", "routed_experts") for i in (0, 1)}
