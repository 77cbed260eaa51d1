"""Model-side switches of the MoE layer: the clamped SwiGLU (``swiglu_limit``, DeepSeek-V4's)
against NumPy, unchanged when off; the router, which no GEMM recipe quantizes."""

import pathlib

from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np
import pytest

from fp8jax.gemm import recipes
from fp8jax.models import config as config_lib
from fp8jax.models import deepseek_moe, hf_convert, llama, moe, policy_rules, registry
from fp8jax.models import policy as policy_lib
from fp8jax.models.policy_rules import Gemms
from fp8jax.train import run_config
from tests.references import reference_model

LIMIT = 0.75
CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "configs"


def _silu(x):
  return x / (1 + np.exp(-x))


def _glu(gate, up, limit):
  """DeepSeek-V4's experts (and gpt-oss's swiglu): the gate clamped from above only, the up
  path to [-limit, limit], both before the activation; float64."""
  gate, up = np.asarray(gate, np.float64), np.asarray(up, np.float64)
  return _silu(np.minimum(gate, limit)) * np.clip(up, -limit, limit)


def _operands(n=257, scale=2.0):
  rng = np.random.default_rng(0)
  gate_edges = np.array([LIMIT, -LIMIT, 2 * LIMIT, -2 * LIMIT, 1.0], np.float32)
  up_edges = np.array([-LIMIT, LIMIT, LIMIT, -2 * LIMIT, 2 * LIMIT], np.float32)
  gate = np.concatenate([gate_edges, rng.standard_normal(n - 5).astype(np.float32) * scale])
  up = np.concatenate([up_edges, rng.standard_normal(n - 5).astype(np.float32) * scale])
  return gate, up


def test_glu_clamps_the_gate_from_above_and_the_up_path_both_ways():
  gate, up = _operands()
  got = np.asarray(moe.glu(jnp.asarray(gate), jnp.asarray(up), LIMIT))
  np.testing.assert_allclose(got, _glu(gate, up, LIMIT), rtol=2e-6, atol=1e-7)
  assert (gate < -LIMIT).any()
  low = gate < -LIMIT  # the gate's low side is not clamped: silu of the value itself
  np.testing.assert_allclose(got[low], (_silu(gate) * np.clip(up, -LIMIT, LIMIT))[low],
                             rtol=2e-6, atol=1e-7)
  bf = moe.glu(jnp.asarray(gate, jnp.bfloat16), jnp.asarray(up, jnp.bfloat16), LIMIT)
  assert bf.dtype == jnp.bfloat16
  rounded = [np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32) for a in (gate, up)]
  np.testing.assert_allclose(np.asarray(bf, np.float32), _glu(*rounded, LIMIT), rtol=2e-2,
                             atol=1e-2)


def test_glu_gradients_stop_past_the_limit_and_pass_at_it():
  gate, up = _operands()
  dg, du = jax.grad(lambda g, u: jnp.sum(moe.glu(g, u, LIMIT)), argnums=(0, 1))(
      jnp.asarray(gate), jnp.asarray(up))
  g64, u64 = np.minimum(gate, LIMIT).astype(np.float64), np.clip(up, -LIMIT, LIMIT)
  sig = 1 / (1 + np.exp(-g64))
  want_dg = np.where(gate > LIMIT, 0.0, sig * (1 + g64 * (1 - sig)) * u64)
  want_du = np.where(np.abs(up) > LIMIT, 0.0, _silu(g64))
  np.testing.assert_allclose(dg, want_dg, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(du, want_du, rtol=1e-5, atol=1e-7)
  assert dg[0] != 0 and du[0] != 0 and du[1] != 0  # at the limit itself (torch.clamp's)


def test_no_limit_is_the_unclamped_swiglu_bit_for_bit():
  gate, up = (jnp.asarray(a, jnp.bfloat16) for a in _operands(scale=40.0))
  want = jax.nn.silu(gate) * up
  for got in (moe.glu(gate, up), moe.glu(gate, up, None), jax.jit(moe.glu)(gate, up)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_routed_experts_clamp_as_a_numpy_loop(fused):
  rng = np.random.default_rng(1)
  t, d, f, e, k = 6, 8, 16, 4, 2
  x = rng.standard_normal((t, d)).astype(np.float32)
  gate, up = (rng.standard_normal((e, d, f)).astype(np.float32) for _ in range(2))
  down = rng.standard_normal((e, f, d)).astype(np.float32)
  ids = np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int32)
  weights = rng.uniform(0.1, 1, (t, k)).astype(np.float32)
  want = np.zeros((t, d))
  for i in range(t):
    for slot in range(k):
      ex = ids[i, slot]
      want[i] += weights[i, slot] * (_glu(x[i] @ gate[ex], x[i] @ up[ex], LIMIT) @ down[ex])
  dispatch = jax.jit(moe.experts_dispatch, static_argnames=("fuse_gate_up", "limit"))
  with jax.default_matmul_precision("highest"):
    got = dispatch(x, weights, ids, gate, up, down, fuse_gate_up=fused, limit=LIMIT)
    ref = moe.experts_reference(x, weights, ids, gate, up, down, limit=LIMIT)
    off = dispatch(x, weights, ids, gate, up, down, fuse_gate_up=fused)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(off) - want).max() > 0.1  # the clamp changes this output


def test_llama_mlp_clamps_as_numpy():
  from flax import nnx
  cfg = llama.Config(dtype="float32", swiglu_limit=0.05)
  mlp = llama.MLP(cfg, nnx.Rngs(params=0))
  x = np.random.default_rng(2).standard_normal((3, cfg.hidden_size)).astype(np.float32)
  w = {n: np.asarray(getattr(mlp, n).kernel[...], np.float64) for n in ("gate", "up", "down")}
  want = _glu(x @ w["gate"], x @ w["up"], 0.05) @ w["down"]
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(mlp(jnp.asarray(x)), want, rtol=1e-5, atol=1e-6)
  assert np.abs(np.clip(x @ w["up"], -0.05, 0.05) - x @ w["up"]).max() > 0  # it clamped


def test_the_option_from_configs_and_overrides():
  assert config_lib.tiny().swiglu_limit is None and llama.Config().swiglu_limit is None
  assert config_lib.tiny(swiglu_limit=10).swiglu_limit == 10.0
  assert config_lib.tiny(swiglu_limit=10) == config_lib.tiny(swiglu_limit=10.0)
  for bad in (0, -1.0, float("inf"), "10", True):
    with pytest.raises(ValueError, match="swiglu_limit must be None .off. or a finite"):
      config_lib.tiny(swiglu_limit=bad)
    with pytest.raises(ValueError, match="llama: swiglu_limit must be None"):
      llama.Config(swiglu_limit=bad)
  assert registry.get("llama:tiny", {"swiglu_limit": 7}).config.swiglu_limit == 7.0
  assert registry.get("deepseek_moe:tiny", {"swiglu_limit": 10.0}).config.swiglu_limit == 10
  for name, model_config in (("validate_small", config_lib.ModelConfig),
                             ("train_llama_tiny", llama.Config)):  # on the command line
    for args, want in (([], None), (["--config.model_overrides.swiglu_limit=10"], 10.0)):
      argv = ["validate", f"--config={CONFIGS / name}.py", *args]
      fv = flags.FlagValues()
      config_flags.DEFINE_config_file("config", flag_values=fv, sys_argv=argv)
      fv(argv)
      config = run_config.model(fv.config).config
      assert isinstance(config, model_config) and config.swiglu_limit == want
  with pytest.raises(ValueError, match="HF's DeepSeek-MoE v1 has no clamped SwiGLU"):
    hf_convert.config_to_hf(config_lib.tiny(swiglu_limit=10))


@pytest.mark.slow
def test_deepseek_moe_with_a_limit_against_the_float64_forward_and_off_bit_identical(
    monkeypatch):
  """Dense layer, shared and routed experts clamped, against the NumPy forward; without a
  limit, the forward of the unclamped SwiGLU's own ops, bit for bit."""
  cfg = config_lib.tiny(dtype="float32", swiglu_limit=0.2)
  params = deepseek_moe.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)
  apply = jax.jit(deepseek_moe.apply, static_argnums=2)
  with jax.default_matmul_precision("highest"):
    logits, aux = apply(params, tokens, cfg)
    off, _ = apply(params, tokens, cfg.replace(swiglu_limit=None))
  want, want_aux = reference_model.forward(params, np.asarray(tokens), cfg)
  scale = np.max(np.abs(want))
  np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5 * scale)
  np.testing.assert_allclose(float(aux["aux_loss"]), want_aux, rtol=1e-5)
  assert np.abs(np.asarray(off) - want).max() > 1e-3 * scale  # the limit acted
  bf16 = config_lib.tiny()
  got, _ = apply(params, tokens, bf16)
  monkeypatch.setattr(moe, "glu", lambda gate, up, limit=None: jax.nn.silu(gate) * up)
  before, _ = jax.jit(deepseek_moe.apply, static_argnums=2)(params, tokens, bf16)
  np.testing.assert_array_equal(got, before)


def _moe_layer(cfg):
  from flax import nnx
  return deepseek_moe.DeepseekMoE(cfg, nnx.Rngs(params=0)).layers[1].mlp


@pytest.mark.slow
def test_no_gemm_recipe_reaches_the_router(monkeypatch):
  """Layer 1's MoE on one input under each recipe: its experts' GEMMs take the recipe, its
  router logits are the BF16 model's bit for bit (x @ W_router in the compute dtype), and
  the layer's output shows the recipe acting."""
  cfg = config_lib.tiny()
  layer = _moe_layer(cfg)
  x = jax.random.normal(jax.random.key(3), (2, 8, cfg.hidden_size), jnp.bfloat16)
  real, seen = moe.router_logits, []
  monkeypatch.setattr(moe, "router_logits", lambda a, w: seen.append(real(a, w)) or seen[-1])

  def logits(policy, with_output=False):
    gemms = Gemms(policy_rules.decisions(policy, cfg.num_hidden_layers), "layers/1")

    def run(x):
      seen.clear()
      y, _, _ = layer(x, lambda name, v: v, gemms.child("mlp"))
      return (seen[0], y) if with_output else seen[0]
    return gemms.child("mlp")(op="ragged_dot"), jax.device_get(jax.jit(run)(x))

  none, (reference, y_bf16) = logits(policy_lib.BF16, with_output=True)
  assert none is None and reference.dtype == jnp.bfloat16
  for name in recipes.RECIPES:
    config, got = logits(policy_lib.parse_policy(f"gemm:{name}"))
    assert config is not None, name  # the recipe reaches this layer's experts
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  np.asarray(reference, np.float32), err_msg=name)
  _, (_, y) = logits(policy_lib.parse_policy("gemm:mxfp8"), with_output=True)
  assert not np.array_equal(np.asarray(y, np.float32), np.asarray(y_bf16, np.float32))
