"""DeepSeek-MoE precision policies (fp8jax.models.policy): spec and layer-set text, site
rules and their checks, and the noise-matched controls, against hand-written values."""

import dataclasses

import pytest

import fp8jax
from fp8jax.gemm import recipes
from fp8jax.models import policy as pl

TENSOR = fp8jax.Granularity("tensor", (), ())
E4M3 = fp8jax.QuantSpec(format="e4m3", granularity=TENSOR)
E5M2 = fp8jax.QuantSpec(format="e5m2", granularity=TENSOR)


@pytest.mark.parametrize("text, fmt, kind, axes, sizes", [
    ("e4m3", "e4m3", "tensor", (), ()),
    ("e5m2/tensor", "e5m2", "tensor", (), ()),
    ("e4m3/channel", "e4m3", "axis", (-1,), (None,)),
    ("e5m2/1x128", "e5m2", "tile", (-1,), (128,)),
    ("e2m1/128x128", "e2m1", "block", (-2, -1), (128, 128)),
    ("  e4m3/1x128 ", "e4m3", "tile", (-1,), (128,)),
])
def test_format_and_granularity_text_gives_a_current_scaled_straight_through_spec(
    text, fmt, kind, axes, sizes):
  spec = pl.parse_spec(text)
  assert spec.format == fmt
  assert (spec.granularity.kind, spec.granularity.axes, spec.granularity.sizes) == (
      kind, axes, sizes)
  assert (spec.scaling, spec.scale_format, spec.backward, spec.noise_control) == (
      "current", "fp32", None, False)


def test_a_preset_name_gives_the_preset_with_its_cotangent_spec():
  spec = pl.parse_spec(" deepseek_v3 ")
  assert spec == fp8jax.preset("deepseek_v3")
  assert (spec.format, spec.granularity.kind, spec.granularity.sizes) == ("e4m3", "tile", (128,))
  assert spec.backward is not None and spec.backward.format == "e4m3"
  hybrid = pl.parse_spec("te_hybrid")
  assert (hybrid.scaling, hybrid.backward.format, hybrid.backward.scaling) == (
      "delayed", "e5m2", "delayed")


@pytest.mark.parametrize("text, history, reduce, margin", [
    ("e4m3/delayed", 1024, "max", 0),
    ("e4m3/delayed(margin=-2)", 1024, "max", -2),
    ("e5m2/tensor/delayed( h = 8 , reduce = most_recent, )", 8, "most_recent", 0),
    ("e4m3/delayed(margin=3,h=4)", 4, "max", 3),
])
def test_delayed_arguments_are_optional_spaced_and_in_any_order(text, history, reduce, margin):
  spec = pl.parse_spec(text)
  assert (spec.scaling, spec.history_len, spec.history_reduce, spec.margin) == (
      "delayed", history, reduce, margin)
  assert spec.granularity.kind == "tensor" and spec.format == text[:4]


def test_parse_delayed_returns_the_quant_spec_fields():
  assert pl.parse_delayed("delayed()") == {"scaling": "delayed"}
  assert pl.parse_delayed("delayed(h=2,reduce=most_recent,margin=1)") == {
      "scaling": "delayed", "history_len": 2, "history_reduce": "most_recent", "margin": 1}
  with pytest.raises(ValueError, match=r"malformed delayed\(\.\.\.\) argument 'h=' in 'ctx'"):
    pl.parse_delayed("delayed(h=)", "ctx")
  with pytest.raises(ValueError, match=r"malformed 'delayed\[h=2\]': use delayed\(h=1024"):
    pl.parse_delayed("delayed[h=2]")


@pytest.mark.parametrize("text, match", [
    ("e9m9", r"unknown spec 'e9m9': use a preset \[.*'deepseek_v3'.*\] or FORMAT"),
    ("e4m3/1x128/extra", r"unknown spec 'e4m3/1x128/extra'"),
    ("tensor", r"unknown spec 'tensor'.*with a format in \[.*'e4m3'"),
    ("e4m3/tile", r"unknown granularity 'tile' in 'e4m3/tile'; known: \['128x128', '1x128', "
                  r"'channel', 'tensor'\]"),
    ("e4m3/channel/delayed", r"delayed scaling is per-tensor only, but "
                             r"'e4m3/channel/delayed' asks for channel"),
    ("e4m3/delayedx", r"malformed 'delayedx' in 'e4m3/delayedx'"),
    ("e4m3/delayed(h=0)", r"^bad spec 'e4m3/delayed\(h=0\)': .*history_len"),
])
def test_bad_spec_text_is_refused_naming_the_problem(text, match):
  with pytest.raises(ValueError, match=match):
    pl.parse_spec(text)


def test_a_delayed_suffix_without_a_format_is_a_value_error():
  with pytest.raises(ValueError, match="unknown spec 'delayed'"):
    pl.parse_spec("delayed")


@pytest.mark.parametrize("text, layers", [
    ("all", None), (" ALL ", None), (2, (2,)), ("0", (0,)), ("0-3", (0, 1, 2, 3)),
    ("5,1-2,2", (1, 2, 5)), (" 7 ", (7,)),
])
def test_layer_sets_are_sorted_deduplicated_tuples_or_none_for_all(text, layers):
  assert pl.parse_layers(text) == layers


@pytest.mark.parametrize("text, match", [
    ("first", "bad layer set 'first': use 'all', '0', '0-8' or '1,3,5-7'"),
    ("-1", "bad layer set '-1': use 'all'"),
    ("1,,2", "bad layer set '1,,2': use 'all'"),
    ("", "bad layer set '': use 'all'"),
    ("3-1", "bad layer set '3-1': no layers, or a negative layer"),
    ("0-10000", "bad layer set '0-10000': layer indices go up to 9999"),
])
def test_bad_layer_sets_are_refused_naming_the_set(text, match):
  with pytest.raises(ValueError, match=match):
    pl.parse_layers(text)


def test_site_policy_is_one_rule_named_by_site_layers_and_format():
  pol = pl.site_policy("moe_out", "1-2", E5M2)
  assert pol.rules == (pl.SiteRule("moe_out", (1, 2), E5M2),)
  assert (pol.name, pol.gemm, pol.gemm_layers, pol.gemm_bf16_tail) == (
      "moe_out@1-2:e5m2", None, None, 0.0)
  assert pl.site_policy("attn_out", 2, E4M3).name == "attn_out@2:e4m3"
  assert pl.site_policy("expert_in", "all", E4M3, name="mine").name == "mine"
  assert pl.site_policy("expert_in", "all", E4M3).rules[0].layers is None


def test_site_rules_refuse_unknown_sites_and_specs_that_are_not_quant_specs():
  with pytest.raises(ValueError, match="unknown quantization site 'attn'; sites: "
                                       r"\('attn_out', 'mlp_out', "):
    pl.SiteRule("attn", (0,), E4M3)
  with pytest.raises(TypeError, match="site attn_out: spec must be a QuantSpec, got 'e4m3'"):
    pl.SiteRule("attn_out", (0,), "e4m3")


def test_policies_refuse_a_bad_tail_share_a_non_gemm_config_and_native_fp8():
  with pytest.raises(ValueError, match=r"gemm_bf16_tail is a share of the layers in \[0, 1\), "
                                       "got 1.0"):
    pl.PrecisionPolicy(gemm_bf16_tail=1.0)
  with pytest.raises(ValueError, match="got -0.1"):
    pl.PrecisionPolicy(gemm_bf16_tail=-0.1)
  with pytest.raises(TypeError, match="gemm must be an fp8jax GemmConfig or None, got 'mxfp8'"):
    pl.PrecisionPolicy(gemm="mxfp8")
  native = recipes.recipe("fp8_tensor").replace(fprop="fp8_native")
  with pytest.raises(ValueError, match="GEMM hook does not support fp8_native directions"):
    pl.PrecisionPolicy(gemm=native)


def test_spec_for_gives_the_last_matching_rule_per_site_and_layer():
  pol = pl.PrecisionPolicy((pl.SiteRule("attn_out", None, E4M3),
                            pl.SiteRule("attn_out", (1,), E5M2),
                            pl.SiteRule("moe_out", (2,), E5M2)), name="p")
  assert pol.spec_for("attn_out", 0) == E4M3
  assert pol.spec_for("attn_out", 1) == E5M2
  assert pol.spec_for("attn_out", 2) == E4M3
  assert pol.spec_for("moe_out", 2) == E5M2
  assert pol.spec_for("moe_out", 1) is None
  assert pol.spec_for("mlp_out", 0) is None
  assert pl.BF16.spec_for("attn_out", 0) is None


def _moe_from_1(i):
  return i >= 1  # the tiny config: a dense first layer, then MoE layers


def test_check_layers_accepts_sites_that_exist_and_rules_on_all_layers():
  pl.PrecisionPolicy((pl.SiteRule("attn_out", (0, 1, 2), E4M3),
                      pl.SiteRule("mlp_out", (0,), E4M3),
                      pl.SiteRule("moe_routed_out", (1, 2), E4M3),
                      pl.SiteRule("moe_out", None, E4M3)), name="ok").check_layers(3, _moe_from_1)
  pl.site_policy("moe_out", "0", E4M3).check_layers(3)  # without is_moe_layer: depth only


@pytest.mark.parametrize("policy, match", [
    (pl.site_policy("attn_out", "1-3", E4M3, name="deep"),
     "policy 'deep': site attn_out names layer 3 but the model has 3 layers"),
    (pl.PrecisionPolicy(name="g", gemm=recipes.recipe("mxfp8"), gemm_layers=(0, 5)),
     "policy 'g': the GEMM recipe names layer 5 but the model has 3 layers"),
    (pl.site_policy("moe_out", "0-1", E4M3, name="m"),
     "policy 'm': site moe_out does not exist at layer 0, which is a dense layer"),
    (pl.site_policy("expert_in", "0", E4M3, name="e"),
     "site expert_in does not exist at layer 0, which is a dense layer"),
    (pl.site_policy("mlp_out", "0,2", E4M3, name="d"),
     "policy 'd': site mlp_out does not exist at layer 2, which is an MoE layer"),
])
def test_check_layers_names_the_policy_site_and_layer_that_do_not_fit(policy, match):
  with pytest.raises(ValueError, match=match):
    policy.check_layers(3, _moe_from_1)


def test_noise_spec_switches_the_spec_and_its_cotangent_spec():
  spec = E4M3.replace(backward=E5M2)
  on = pl.noise_spec(spec, True)
  assert on.noise_control and on.backward.noise_control
  assert on.replace(noise_control=False, backward=E5M2) == spec  # nothing else changes
  off = pl.noise_spec(on, False)
  assert off == spec
  assert pl.noise_spec(None, True) is None
  assert pl.noise_spec(E4M3, True) == E4M3.replace(noise_control=True)


def test_noise_gemm_controls_every_role_and_refuses_the_scaling_aware_transpose():
  base = recipes.recipe("fp32_blockwise")
  on = pl.noise_gemm(base, True, "p")
  specs = list(on.roles.specs())
  assert len(specs) == 3 and all(s.noise_control for s in specs)
  assert on.replace(roles=base.roles) == base
  assert pl.noise_gemm(on, False, "p") == base
  assert pl.noise_gemm(None, True, "p") is None
  aware = base.replace(transpose="scaling_aware")
  with pytest.raises(ValueError, match="policy 'mine': the scaling-aware transpose "
                                       "re-expresses FP8 payloads and has no noise-matched "
                                       "control"):
    pl.noise_gemm(aware, True, "mine")
  assert pl.noise_gemm(aware, False, "mine") == aware  # switching off is always possible


def test_noise_policy_controls_every_quantization_and_keeps_the_layers():
  pol = pl.PrecisionPolicy((pl.SiteRule("attn_out", (0,), E4M3.replace(backward=E5M2)),),
                           name="p", gemm=recipes.recipe("nvfp4"), gemm_layers=(0, 1),
                           gemm_bf16_tail=0.25)
  ctl = pl.noise_policy(pol)
  assert ctl.name == "noise(p)"
  assert (ctl.gemm_layers, ctl.gemm_bf16_tail) == ((0, 1), 0.25)
  rule = ctl.rules[0]
  assert (rule.site, rule.layers) == ("attn_out", (0,))
  assert rule.spec.noise_control and rule.spec.backward.noise_control
  assert all(s.noise_control for s in ctl.gemm.roles.specs())
  assert pl.is_noise_control(ctl) and not pl.is_noise_control(pol)


def test_noise_policy_refuses_bf16_a_control_and_a_scaling_aware_gemm():
  with pytest.raises(ValueError, match="the BF16 policy quantizes nothing"):
    pl.noise_policy(pl.PrecisionPolicy(name="empty"))
  ctl = pl.noise_policy(pl.site_policy("attn_out", "0", E4M3, name="a"))
  with pytest.raises(ValueError, match=r"policy 'noise\(a\)' is already a noise-matched control"):
    pl.noise_policy(ctl)
  aware = pl.PrecisionPolicy(name="sa", gemm=recipes.recipe("mxfp8").replace(
      transpose="scaling_aware"))
  with pytest.raises(ValueError, match=r"policy '.*sa.*': the scaling-aware transpose"):
    pl.noise_policy(aware)


def test_a_policy_is_a_control_only_when_every_spec_it_makes_is_one():
  assert not pl.is_noise_control(pl.BF16)  # nothing quantized: no control
  one = pl.SiteRule("attn_out", (0,), E4M3.replace(noise_control=True))
  assert pl.is_noise_control(pl.PrecisionPolicy((one,), name="x"))
  half = pl.PrecisionPolicy((one, pl.SiteRule("moe_out", (1,), E4M3)), name="x")
  assert not pl.is_noise_control(half)
  mixed = pl.PrecisionPolicy((one,), name="x", gemm=recipes.recipe("mxfp8"))
  assert not pl.is_noise_control(mixed)
  gemm_only = pl.PrecisionPolicy(name="x", gemm=pl.noise_gemm(recipes.recipe("mxfp8"), True, "x"))
  assert pl.is_noise_control(gemm_only)


def test_control_base_undoes_the_control_and_its_name():
  pol = pl.PrecisionPolicy((pl.SiteRule("moe_out", (1, 2), E5M2.replace(backward=E4M3)),),
                           name="p", gemm=recipes.recipe("mxfp8"), gemm_layers=(2,))
  assert pl.control_base(pl.noise_policy(pol)) == pol
  renamed = dataclasses.replace(pl.noise_policy(pol), name="my control")
  assert pl.control_base(renamed) == dataclasses.replace(pol, name="my control")
  with pytest.raises(ValueError, match="policy 'p' is not a noise-matched control"):
    pl.control_base(pol)
  with pytest.raises(ValueError, match="policy 'bf16' is not a noise-matched control"):
    pl.control_base(pl.BF16)


def test_record_strips_the_expression_and_leaves_out_unset_spec_fields():
  rec = pl.record(pl.site_policy("attn_out", "0-1", E4M3, name="n"), "  attn@0-1:e4m3 ")
  assert (rec["expression"], rec["name"], rec["gemm"], rec["gemm_layers"],
          rec["gemm_bf16_tail"]) == ("attn@0-1:e4m3", "n", None, None, 0.0)
  (rule,) = rec["rules"]
  assert (rule["site"], rule["layers"]) == ("attn_out", [0, 1])
  assert rule["spec"]["granularity"] == {"kind": "tensor", "axes": [], "sizes": []}
  assert rule["spec"]["backward"] is None and rule["spec"]["noise_control"] is False
  assert not {"four_over_six", "four_over_six_max", "row_scaled"} & set(rule["spec"])
  assert pl.record(pl.BF16)["expression"] == "bf16"
