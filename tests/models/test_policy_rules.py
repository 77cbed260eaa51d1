"""DeepSeek-MoE's policies through the rule engine: the same decisions and the same bits
as the model computed before (``tests/references/reference_policy.py``)."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax import rules as rules_lib
from fp8jax.models import config as mc
from fp8jax.models import deepseek_moe as dm
from fp8jax.models import delayed_sites, policy_rules
from fp8jax.models import policy as pl
from fp8jax.study.comparison import policies as policies_lib
from tests.references.reference_policy import LegacyDecisions


def _grid_policies(num_layers: int) -> dict[str, pl.PrecisionPolicy]:
  exprs = {}
  for grid in ("sites", "formats", "delayed"):
    exprs.update(policies_lib.GRIDS[grid](num_layers))
  return {name: pl.parse_policy(expr) for name, expr in exprs.items()}


MIXED = ["attn@0:deepseek_v3+moe@1-2:e5m2/1x128+gemm:fp32_blockwise@1-2",
         "gemm:nvfp4_recipe+expert_in@1:e4m3+routed@all:e5m2+routed@2:deepseek_v3",
         "shared@1:e4m3/delayed(h=4)+gemm:mxfp8@0,2", "noise(gemm:nvfp4_recipe)",
         "mlp@0:e4m3+attn@all:e5m2+attn@1:e4m3", "bf16"]


def _gemm_paths(cfg) -> dict[str, tuple[str, ...]]:
  """``{path: ops}`` of the model's GEMMs under layers/: every nnx.Linear, and the MoE
  modules' routed experts (``ragged_dot``)."""
  model = nnx.eval_shape(lambda: dm.DeepseekMoE(cfg, nnx.Rngs(0)))
  out = {}
  for path, module in rules_lib.module_paths(model).items():
    if path.startswith("layers/") and isinstance(module, nnx.Linear):
      out[path] = ("dot_general",)
    elif isinstance(module, dm.MoE):
      out[path] = ("ragged_dot",)
  return out


@pytest.mark.parametrize("num_layers", [3, 9])
def test_engine_decisions_equal_the_legacy_ones(num_layers):
  """Every site of every layer, every GEMM of the model's module paths: the engine's
  answer is the pre-engine one, for the grids' policies and mixed expressions."""
  cfg = mc.tiny(num_hidden_layers=num_layers)
  paths = _gemm_paths(cfg)
  assert len(paths) == 4 * num_layers + 3 + 4 * (num_layers - 1)  # + routed experts
  policies = {**_grid_policies(num_layers), **{e: pl.parse_policy(e) for e in MIXED}}
  for name, policy in policies.items():
    new, old = policy_rules.decisions(policy, num_layers), LegacyDecisions(policy, num_layers)
    for layer in range(num_layers):
      for site in pl.SITES:
        assert new.site(site, layer) == old.site(site, layer), (name, site, layer)
        assert policy.spec_for(site, layer) == old.site(site, layer), (name, site, layer)
      assert (policy.at_layer(layer, num_layers).gemm == old.layer_gemm(layer)), (name, layer)
    for path, (op,) in paths.items():
      assert new.gemm(path, op) == old.gemm(path, op), (name, path)
      assert new.gemm(path, "einsum") is None


def test_policy_rules_name_the_paths():
  """The compiled rules: sites as named points, the recipe on the linear layers' paths
  and the routed experts' ragged_dot, the BF16 tail undone."""
  policy = pl.parse_policy("attn@0-1:e4m3+gemm:nvfp4_recipe")
  rules = policy.to_rules(9)
  assert [(r.module_path, r.role, r.op) for r in rules] == [
      ("layers/(0|1)/attn_out", "output", None),
      (r"layers/\d+/(" + policy_rules.LINEAR_PATHS + ")", "gemm", "dot_general"),
      (r"layers/\d+/mlp", "gemm", "ragged_dot"),
      ("layers/(8)/.*", "gemm", None)]
  assert rules_lib.gemm_config(rules, "layers/7/mlp/shared_experts/up_proj") == policy.gemm
  assert rules_lib.gemm_config(rules, "layers/8/self_attn/o_proj") is None
  assert rules_lib.gemm_config(rules, "lm_head") is None
  assert rules_lib.output_spec(rules, "layers/1/attn_out") == policy.spec_for("attn_out", 1)
  assert policy.to_rules(9) is rules and hash(rules) == hash(policy.to_rules(9))


def _grid_cases():
  """(name, config, policy) of the seed, formats and delayed grids on the tiny model (the
  seed and delayed grids quantize the MoE output of layer 0: every layer MoE there)."""
  out = {}
  for grid in ("sites", "formats", "delayed"):
    cfg = mc.tiny() if grid == "formats" else mc.tiny(first_k_dense_replace=0)
    for name, expr in policies_lib.GRIDS[grid](cfg.num_hidden_layers).items():
      out[name] = (cfg, pl.parse_policy(expr))
  return out


def _step(cfg, policy):
  """jit(value_and_grad) of the loss under ``policy``: (logits, (param grads, updated
  amax histories)); a fresh jit, so nothing is cached from another decision route."""
  def loss(p, s, tokens):
    logits, aux = dm.apply(p, tokens, cfg, policy, delayed_state=s)
    return dm.lm_loss(logits, tokens) + aux["aux_loss"], logits

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _inputs(cfg, policy):
  params = dm.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
  return params, delayed_sites.init(cfg, policy), tokens


def _both_routes(monkeypatch, fn):
  """``fn()`` with the model's decisions from the engine, then from the legacy code."""
  engine = policy_rules.decisions
  got = fn()
  monkeypatch.setattr(policy_rules, "decisions", LegacyDecisions)
  try:
    want = fn()
  finally:
    monkeypatch.setattr(policy_rules, "decisions", engine)
  return got, want


@functools.cache
def _bf16_program(cfg) -> str:
  return _step(cfg, pl.BF16).lower(*_inputs(cfg, pl.BF16)).as_text()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_grid_cases()))
def test_grid_policy_is_the_same_program_through_the_engine(monkeypatch, name):
  """The whole training computation (forward, loss, gradients, history updates) lowers
  to the same StableHLO through the engine as with the pre-engine decisions: the same
  program, so the same bits on any backend."""
  cfg, policy = _grid_cases()[name]
  args = _inputs(cfg, policy)
  got, want = _both_routes(monkeypatch, lambda: _step(cfg, policy).lower(*args).as_text())
  assert got == want
  assert got != _bf16_program(cfg), "the policy changes the program"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["moe_l0_e4m3_delayed", "fp8_tensor"])
def test_grid_policy_logits_and_gradients_are_bit_identical(monkeypatch, name):
  """Logits and gradients (params and amax histories) computed through the engine equal
  those of the pre-engine decisions bit for bit (a delayed-scaled site, a GEMM recipe;
  the test above shows the whole grids to be the same programs)."""
  cfg, policy = _grid_cases()[name]
  args = _inputs(cfg, policy)
  got, want = _both_routes(monkeypatch, lambda: _step(cfg, policy)(*args))
  leaves = jax.tree_util.tree_leaves_with_path(want)
  assert len(leaves) == len(jax.tree.leaves(got)) > 20
  for (path, w), g in zip(leaves, jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                  err_msg=f"{name}: {jax.tree_util.keystr(path)}")
  assert jnp.all(jnp.isfinite(got[0][1]))


def test_the_parsed_policy_flows_to_the_state_layout(monkeypatch):
  """The run's policy is parsed once (``run_config.check``); the train state's layout
  takes that object instead of parsing ``cfg.policy`` again."""
  from fp8jax.train import loop, run_config  # noqa: PLC0415
  from fp8jax.train import mesh as mesh_lib  # noqa: PLC0415
  from tests.train.test_loop import small_config  # noqa: PLC0415

  c = small_config(steps=1)
  c.policy = "attn@0-2:e4m3/delayed(h=4)"
  model, policy = run_config.check(c)

  def parse_again(expr):
    raise AssertionError(f"the policy {expr!r} was parsed a second time")

  monkeypatch.setattr(pl, "parse_policy", parse_again)
  _, abstract, _ = loop.state_layout(c, model, loop.optimizer_for(c), mesh_lib.data_mesh(),
                                     policy)
  assert abstract.delayed["attn_out"][2]["fwd"].shape == (4,)
