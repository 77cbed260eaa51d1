"""Policy expressions round-trip: ``parse_policy(to_expression(p))`` is ``p``."""

import dataclasses

from hypothesis import given, settings
import pytest

import fp8jax
from fp8jax.models import deepseek_model
from fp8jax.models import policy as policy_lib
from fp8jax.models.policy_expression import layers_expression, same_numerics, to_expression
from fp8jax.study.comparison import policies as sweep_policies
from tests import strategies


@settings(max_examples=150, deadline=None)
@given(strategies.policies())
def test_policy_round_trips(pol):
  text = to_expression(pol)
  back = policy_lib.parse_policy(text)
  assert back == dataclasses.replace(pol, name=text)
  assert to_expression(back) == text
  assert policy_lib.parse_policy(to_expression(back)) == back  # named by itself: equal whole


@settings(max_examples=60, deadline=None)
@given(strategies.policies())
def test_spec_round_trips(pol):
  if policy_lib.is_noise_control(pol):
    pol = policy_lib.control_base(pol)
  for rule in pol.rules:
    assert policy_lib.parse_spec(to_expression(rule.spec)) == rule.spec


@pytest.mark.parametrize("grid", sorted(sweep_policies.GRIDS))
@pytest.mark.parametrize("noise", [False, True])
def test_grids_round_trip_through_the_sweep_expression(grid, noise):
  pols = sweep_policies.expand_policies([f"noise({grid})" if noise else grid], num_layers=9)
  for pol in pols:
    back = policy_lib.parse_policy(sweep_policies.expression(pol))
    assert same_numerics(back, pol.source), pol.name
    assert deepseek_model.variant(back, 9).rules == pol.rules, pol.name


@pytest.mark.parametrize("expr, text", [
    ("moe@0:deepseek_v3", "moe_out@0:deepseek_v3"),
    ("attn@0-8:e4m3", "attn_out@0-8:e4m3/tensor"),
    ("attn_l0-8_e4m3_delayed", "attn_out@0-8:e4m3/tensor/delayed(h=1024,reduce=max,margin=0)"),
    ("shared@1,3,4,5:e5m2/1x128+expert_in@all:mxfp8", "moe_shared_out@1,3-5:e5m2/1x128+"
     "expert_in@all:mxfp8"),
    ("noise(gemm:nvfp4_recipe@0-3)", "noise(gemm:nvfp4_recipe@0-3)"),
    ("routed@2:e4m3/128x128+gemm:fp32_blockwise", "moe_routed_out@2:e4m3/128x128+"
     "gemm:fp32_blockwise"),
    ("bf16", "bf16"),
])
def test_canonical_text(expr, text):
  """Specs with tiles, blocks and cotangent specs (presets) come back (the former text,
  ``e4m3/tile``, could not be read)."""
  assert to_expression(policy_lib.parse_policy(expr)) == text
  assert sweep_policies.expression(policy_lib.parse_policy(expr)) == text
  assert same_numerics(policy_lib.parse_policy(text), policy_lib.parse_policy(expr))


def test_layers_expression():
  assert layers_expression(None) == "all"
  assert layers_expression((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
  assert policy_lib.parse_layers(layers_expression((3, 4, 9))) == (3, 4, 9)


def test_what_the_grammar_cannot_write_is_refused():
  odd = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.tile(64))
  with pytest.raises(ValueError, match="site attn_out: spec e4m3 1x64@-1 .* no policy "
                                       "expression"):
    to_expression(policy_lib.site_policy("attn_out", "0", odd))
  custom = policy_lib.PrecisionPolicy(gemm=fp8jax.GemmConfig(transpose="double"), name="c")
  with pytest.raises(ValueError, match="policy 'c': its GEMM config .* none of the named"):
    to_expression(custom)
  tail = dataclasses.replace(policy_lib.parse_policy("gemm:mxfp8"), gemm_bf16_tail=0.5)
  with pytest.raises(ValueError, match="gemm_bf16_tail=0.5 differs from recipe 'mxfp8'"):
    to_expression(tail)
  half = policy_lib.parse_policy("attn@0:e4m3+moe@0:e4m3")
  half = dataclasses.replace(half, rules=(
      half.rules[0], dataclasses.replace(half.rules[1], spec=half.rules[1].spec.replace(
          noise_control=True))))
  with pytest.raises(ValueError, match="site moe_out: spec .* noise-control"):
    to_expression(half)
  with pytest.raises(TypeError, match="expected a QuantSpec or PrecisionPolicy, got str"):
    to_expression("attn@0:e4m3")


@pytest.mark.parametrize("layers", ["0-300000000", "0-99999999999999999999", "10000"])
def test_layer_ranges_beyond_any_model_are_refused_before_they_are_built(layers):
  with pytest.raises(ValueError, match="layer indices go up to 9999"):
    policy_lib.parse_policy(f"attn@{layers}:e4m3")
  assert policy_lib.parse_layers("9998-9999") == (9998, 9999)


def test_a_policy_that_is_not_a_string_is_a_type_error():
  with pytest.raises(TypeError, match="must be a string, got NoneType"):
    policy_lib.parse_policy(None)
