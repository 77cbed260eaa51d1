"""How DeepSeek-MoE's forward computes (fp8jax.models.deepseek_compute.Compute): its checks,
its fields by name, and that apply's options by name and a Compute record are one thing."""

import jax
import numpy as np
import pytest

from fp8jax.models import config, deepseek_compute, deepseek_model, deepseek_moe


def test_an_unknown_moe_path_and_an_unknown_option_are_refused_by_name():
  with pytest.raises(ValueError, match=r"unknown MoE implementation 'gpu'; use one of "
                                       r"\('dispatch', 'pallas', 'reference'\)"):
    deepseek_compute.Compute(moe_impl="gpu")
  with pytest.raises(TypeError, match=r"unknown forward option\(s\) \['moe_kernel'\]; "
                                      r"DeepSeek-MoE's are \['moe_impl', 'moe_groups'"):
    deepseek_compute.Compute.of(moe_kernel="pallas")
  with pytest.raises(TypeError, match=r"unknown forward option\(s\) \['scan'\]"):
    deepseek_moe.apply({}, np.zeros((1, 4), np.int32), config.tiny(), scan=True)


def test_fields_by_name_replace_those_of_a_given_record():
  base = deepseek_compute.Compute(moe_impl="reference", deterministic=True)
  got = deepseek_compute.Compute.of(base, telemetry=True, moe_groups=2)
  assert got == deepseek_compute.Compute(moe_impl="reference", moe_groups=2,
                                         deterministic=True, telemetry=True)
  assert deepseek_compute.Compute.of() == deepseek_compute.DEFAULT
  assert deepseek_model.Options(moe_impl="reference", moe_groups=2).compute == (
      deepseek_compute.Compute(moe_impl="reference", moe_groups=2))


def test_apply_takes_the_record_or_its_fields_by_name_alike():
  cfg = config.tiny(num_hidden_layers=2)
  params = deepseek_moe.init(cfg, jax.random.key(0))
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 8)).astype(np.int32)
  policy = deepseek_model.policy_lib.parse_policy("moe@1:e4m3")
  by_name = deepseek_moe.apply(params, tokens, cfg, policy, moe_impl="reference",
                               telemetry=True)
  by_record = deepseek_moe.apply(params, tokens, cfg, policy, compute=deepseek_compute.Compute(
      moe_impl="reference", telemetry=True))
  jax.tree.map(np.testing.assert_array_equal, by_name, by_record)
  assert set(by_name[1]["telemetry"]) == {"layer_1/moe_out"}
  plain = deepseek_moe.apply(params, tokens, cfg, policy, moe_impl="reference")
  assert "telemetry" not in plain[1]
