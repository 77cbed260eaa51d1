"""Policies as text for models quantized by rules: the site grid of a model that names its
site modules, the cell a policy's record names from what its rule matches, and the
noise-matched controls of rules policies."""

import re

import jax
import numpy as np
import pytest

from fp8jax.gemm import recipes
from fp8jax.models import llama, registry, rules_policy
from fp8jax.models import policy as policy_lib
from fp8jax.study.comparison import policies

FORMATS = ("e4m3", "e5m2")


@pytest.mark.parametrize("name, modules", [("llama:tiny", ("attn", "mlp")),
                                           ("mixtral:tiny", ("attn", "moe"))])
def test_the_site_grid_of_a_rules_model_names_its_cells(name, modules):
  model = registry.get(name)
  n = model.config.num_layers
  assert n >= 2 and tuple(model.sites) == modules
  want = {}
  for module in modules:
    for layers, depth in (([0], "l0"), (list(range(n)), f"l0-{n - 1}")):
      for fmt in FORMATS:
        path = "|".join(str(i) for i in layers)
        text = f"output:{fmt}@layers/{path if len(layers) == 1 else f'({path})'}/"
        want[f"{module}_{depth}_{fmt}"] = (text + model.sites[module].split("/")[-1],
                                           {"module": module, "depth": depth, "format": fmt})
  grid = rules_policy.site_grid(model.sites, n)
  assert {k: v for k, v in grid.items()} == {k: text for k, (text, _) in want.items()}
  for cell_name, (text, cell) in want.items():
    assert model.policy(text).record["cell"] == cell, cell_name


@pytest.mark.parametrize("text, cell", [
    (r"output:e4m3@layers/\d+/attn", {"module": "attn", "depth": "l0-1", "format": "e4m3"}),
    ("output:e5m2@layers/1/mlp", {"module": "mlp", "depth": "l1", "format": "e5m2"}),
    ("output:e4m3@layers/0/attn.*", None),          # also the q, k, v, o projections
    ("output:e4m3@layers/(0|1)/(attn|mlp)", None),  # two modules
    ("output:e4m3/1x128@layers/0/mlp", None),       # not the grid's per-tensor spec
    ("gemm:mxfp8", None),
    ("output:e4m3@layers/0/mlp+gemm:mxfp8", None),
    ("bf16", None)])
def test_the_cell_is_read_from_what_the_rule_matches(text, cell):
  assert registry.get("llama:tiny").policy(text).record["cell"] == cell


def test_layers_that_are_not_consecutive_are_no_cell():
  model = registry.get("llama:tiny", {"num_layers": 3})
  assert model.policy("output:e4m3@layers/(0|2)/attn").record["cell"] is None
  assert model.policy("output:e4m3@layers/(1|2)/attn").record["cell"] == {
      "module": "attn", "depth": "l1-2", "format": "e4m3"}


def test_a_sweep_expands_the_site_grids_of_a_rules_model():
  model = registry.get("llama:tiny")
  small = policies.expand_policies(["sites_small"], model)
  assert [p.name for p in small] == ["mlp_l0-1_e4m3", "mlp_l0_e4m3", "attn_l0_e4m3",
                                     "mlp_l0-1_e5m2"]
  for p in small:
    entry = model.policy_meta(p)
    assert entry["record"]["name"] == p.name and entry["expr"] == p.expr
    module, depth, fmt = p.name.split("_")
    assert entry["record"]["cell"] == {"module": module, "depth": depth, "format": fmt}
  assert len(policies.expand_policies(["sites"], model)) == 8
  formats = policies.expand_policies(["formats"], model)
  assert [p.expr for p in formats] == list(policies.formats_grid(2).values())


def test_grids_a_rules_model_cannot_take_are_refused_by_name():
  model = registry.get("llama:tiny")
  bare = llama.rules_model(model.config, llama.Llama, llama.CLASSIFIER, "bare", lambda s: 0.0)
  for spec in ("sites_small", "delayed", "noise(delayed)"):
    with pytest.raises(ValueError, match=r"names no site modules \(api.Model.sites\)"):
      policies.expand_policies([spec], bare)


@pytest.mark.parametrize("name, leaves", [("llama:tiny", {"attn": 1, "mlp": 1}),
                                          ("mixtral:tiny", {"attn": 1, "moe": 1})])
def test_the_delayed_grid_of_a_rules_model_is_deepseeks_on_its_site_modules(name, leaves):
  """DeepSeek-MoE's delayed grid (fp8jax.models.policy_grid.delayed_grid): each site module
  on layer 0 and on every layer, E4M3 per tensor, current vs delayed scaling (history
  1024, max); the records carry the scaling (a current cell's record names its cell, a
  delayed one's none, as DeepSeek's do); a delayed cell's histories are the outputs of
  its modules (Mixtral's MoE block returns its output, router weights and balance loss)."""
  model = registry.get(name)
  n, grid = model.config.num_layers, policies.expand_policies(["delayed"], model)
  deepseek = {p.name: p.record for p in policies.expand_policies(["delayed"], n)}
  names = [n.replace("moe", "mlp") if "mlp" in leaves else n for n in deepseek]
  assert [p.name for p in grid] == names and len(grid) == 8
  delayed = policy_lib.parse_spec("e4m3/delayed(h=1024,reduce=max,margin=0)")
  for p, ds in zip(grid, deepseek.values(), strict=True):
    record, module = model.policy_meta(p)["record"], p.name.split("_")[0]
    (rule,) = p.rules
    assert rule.action == (delayed if p.name.endswith("_delayed") else
                           policy_lib.parse_spec("e4m3"))
    ((site,), (ds_site,)) = record["sites"], ds["sites"]
    assert {k: site[k] for k in ("format", "granularity", "scaling")} == {
        k: ds_site[k] for k in ("format", "granularity", "scaling")}
    assert (record["cell"] is None) == (ds["cell"] is None), p.name
    layers = [0] if "_l0_" in p.name else list(range(n))
    state = model.delayed_init(p)
    assert jax.tree.map(np.shape, state) == ({} if ds["cell"] else {
        model.sites[module].replace("{i}", str(i)): {j: {"fwd": (1024,)}
                                                       for j in range(leaves[module])}
        for i in layers})
  assert [p.name for p in policies.expand_policies(["noise(delayed)"], model)] == [
      f"noise({p.name})" for p in grid]
  (one,) = policies.expand_policies([grid[1].name], model)  # a cell by its name
  assert one.rules == grid[1].rules and one.name == grid[1].name


def test_policy_text_parses_into_rules_with_a_recipes_bf16_layers():
  v = rules_policy.parse(r"gemm:fp32_blockwise@layers/\d+/mlp/.*+output:e4m3@head")
  assert [(r.module_path, r.role) for r in v.rules] == [(r"layers/\d+/mlp/.*", "gemm"),
                                                        ("head", "output")]
  assert v.rules[0].action == recipes.recipe("fp32_blockwise")
  assert v.rules[1].action == policy_lib.parse_spec("e4m3")
  assert v.name == v.expr == r"gemm:fp32_blockwise@layers/\d+/mlp/.*+output:e4m3@head"
  assert not len(rules_policy.parse(" bf16 ").rules)
  # a recipe with BF16 layers: its share of the last layers back to none
  tail = rules_policy.parse("gemm:nvfp4_recipe", 12, "layers/{i}/.*").rules
  kept = round(recipes.BF16_TAIL["nvfp4_recipe"] * 12)
  assert [(r.module_path, r.action) for r in tail[1:]] == [
      (f"layers/{i}/.*", None) for i in range(12 - kept, 12)]
  with pytest.raises(ValueError, match="does not name its layers"):
    rules_policy.parse("gemm:nvfp4_recipe")
  for bad, match in (("fp8", "bad policy term 'fp8'"), ("gemm:nope", "unknown GEMM recipe"),
                     ("weight:none@x", "takes a spec"), ("output:e9m9", "output:e9m9")):
    with pytest.raises(ValueError, match=match):
      rules_policy.parse(bad)


def _specs(variant):
  """Every QuantSpec the rules of ``variant`` quantize with, cotangent specs included."""
  out = []
  for r in variant.rules:
    if r.action is None:
      continue
    for spec in ([r.action] if r.role != "gemm" else list(r.action.roles.specs())):
      while spec is not None:
        out.append(spec)
        spec = spec.backward
  return out


def test_the_noise_control_of_a_rules_policy_marks_every_quantization():
  model = registry.get("llama:tiny")
  text = "output:deepseek_v3@layers/0/attn+gemm:fp32_blockwise@layers/1/mlp/.*"
  base, ctl = model.policy(text), model.policy(f"noise({text})")
  assert (ctl.name, ctl.expr, ctl.control_of) == (f"noise({text})", f"noise({text})", text)
  assert [(r.module_path, r.role) for r in ctl.rules] == [(r.module_path, r.role)
                                                          for r in base.rules]
  assert len(_specs(ctl)) == len(_specs(base)) == 5  # the output, its cotangent, 3 roles
  assert all(s.noise_control for s in _specs(ctl))
  assert [s.replace(noise_control=False, backward=None) for s in _specs(ctl)] == [
      s.replace(backward=None) for s in _specs(base)]
  entry = model.policy_meta(ctl)
  assert (entry["kind"], entry["control_of"]) == ("control", text)
  assert entry["record"]["noise"] and entry["record"]["cell"] is None
  assert model.policy_meta(base)["kind"] == "policy" and not base.record["noise"]
  for bad, match in ((f"noise(noise({text}))", "already a noise-matched control"),
                     ("noise(bf16)", "quantizes nothing")):
    with pytest.raises(ValueError, match=re.escape(match)):
      model.policy(bad)


def test_a_rules_models_site_grid_gets_its_noise_matched_controls():
  model = registry.get("llama:tiny")
  small = policies.expand_policies(["sites_small"], model)
  assert policies.site_controls(small) == ["noise(mlp_l0-1_e4m3)"]  # all layers, E4M3
  (ctl,) = policies.expand_policies(["noise(mlp_l0-1_e4m3)"], model)
  assert (ctl.name, ctl.control_of) == ("noise(mlp_l0-1_e4m3)", "mlp_l0-1_e4m3")
  assert ctl.rules == rules_policy.noise_control(small[0]).rules
  grid = policies.expand_policies(["noise(sites_small)"], model)
  assert [p.name for p in grid] == [f"noise({p.name})" for p in small]


@pytest.mark.slow
def test_a_noise_control_computes_other_numbers_than_its_policy_and_bf16():
  model = registry.get("llama:tiny")
  params = jax.jit(model.init)(jax.random.key(0))  # one compile, not one per op
  tokens = np.random.default_rng(0).integers(0, model.vocab_size, (2, 16)).astype(np.int32)
  text = r"output:e4m3@layers/\d+/mlp"
  apply = jax.jit(lambda p, t, policy: model.apply(p, t, policy)[0], static_argnums=2)
  logits = {name: np.asarray(apply(params, tokens, model.policy(name)))
            for name in ("bf16", text, f"noise({text})")}
  again = np.asarray(apply(params, tokens, model.policy(f"noise({text})")))
  np.testing.assert_array_equal(again, logits[f"noise({text})"])  # the same draws
  for a, b in ((text, "bf16"), (f"noise({text})", "bf16"), (f"noise({text})", text)):
    assert not np.array_equal(logits[a], logits[b]), (a, b)
