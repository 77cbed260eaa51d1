"""Model configs and parameter counts (against the published figures)."""

import pytest

from fp8jax.models import config as mc


def test_param_counts_match_published_numbers():
  two_b = mc.param_counts(mc.deepseek_moe_2b())
  assert two_b["total"] == pytest.approx(1.97e9, rel=0.01)
  assert two_b["activated"] == pytest.approx(0.32e9, rel=0.02)
  sixteen = mc.param_counts(mc.deepseek_moe_16b())
  assert sixteen["total"] == pytest.approx(16.38e9, rel=0.002)
  assert sixteen["activated"] == pytest.approx(2.83e9, rel=0.005)


def test_layer_layout_and_validation():
  cfg = mc.deepseek_moe_16b()
  assert not cfg.is_moe_layer(0) and all(cfg.is_moe_layer(i) for i in range(1, 28))
  assert all(mc.deepseek_moe_2b().is_moe_layer(i) for i in range(9))
  assert [mc.tiny(moe_layer_freq=2, first_k_dense_replace=0).is_moe_layer(i)
          for i in range(3)] == [True, False, True]
  assert mc.deepseek_moe_2b(expert_pad_to=864).expert_width == 864
  with pytest.raises(ValueError, match="not divisible"):
    mc.tiny(num_attention_heads=5)
  with pytest.raises(ValueError, match="below moe_intermediate_size"):
    mc.tiny(expert_pad_to=16)
  with pytest.raises(ValueError, match="unknown model config 'deepseek_3b'"):
    mc.get_config("deepseek_3b")


@pytest.mark.parametrize("name,changes", [("tiny", {}), ("tiny", {"num_key_value_heads": 1}),
                                          ("deepseek_moe_2b", {}), ("deepseek_moe_16b", {})])
def test_param_tree_sizes_equal_the_count_formula(name, changes):
  import jax
  import numpy as np

  from fp8jax.models import deepseek_moe

  cfg = mc.get_config(name, **changes)
  leaves = jax.tree.leaves(deepseek_moe.abstract_params(cfg))
  assert sum(int(np.prod(x.shape)) for x in leaves) == mc.param_counts(cfg)["total"]


def test_grouped_query_attention_config():
  gqa = mc.tiny(num_key_value_heads=2)
  assert gqa.kv_heads == 2 and gqa.head_dim == 16
  assert mc.tiny(num_key_value_heads=4) == mc.tiny()  # MHA is stored as None
  assert mc.tiny().num_key_value_heads is None and mc.tiny().kv_heads == 4
  assert mc.tiny().replace(num_attention_heads=2).kv_heads == 2  # MHA follows the heads
  for bad in (3, 0, 8):
    with pytest.raises(ValueError, match=f"num_key_value_heads .* got {bad}"):
      mc.tiny(num_key_value_heads=bad)
  # k and v shrink by heads / kv_heads: 2 * d * (d - d_kv) per layer fewer weights.
  d, d_kv, layers = 64, 2 * 16, 3
  assert (mc.param_counts(mc.tiny())["total"] - mc.param_counts(gqa)["total"]
          == layers * 2 * d * (d - d_kv))
