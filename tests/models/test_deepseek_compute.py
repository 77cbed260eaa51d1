"""How DeepSeek-MoE's forward computes (fp8jax.models.deepseek_compute.Compute): its checks,
its fields by name, and that apply's options by name and a Compute record are one thing."""

import functools

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
  params = deepseek_moe.abstract_params(cfg)
  tokens = jax.ShapeDtypeStruct((2, 8), np.int32)
  policy = deepseek_model.policy_lib.parse_policy("moe@1:e4m3")

  def program(**kw):  # traced only: the same jaxpr is the same program
    fn = functools.partial(deepseek_moe.apply, cfg=cfg, policy=policy, **kw)
    return jax.make_jaxpr(fn)(params, tokens), jax.eval_shape(fn, params, tokens)[1]

  by_name, aux = program(moe_impl="reference", telemetry=True)
  by_record, _ = program(compute=deepseek_compute.Compute(moe_impl="reference",
                                                          telemetry=True))
  assert str(by_name) == str(by_record)
  assert set(aux["telemetry"]) == {"layer_1/moe_out"}
  plain, plain_aux = program(moe_impl="reference")
  assert "telemetry" not in plain_aux and str(plain) != str(by_name)
