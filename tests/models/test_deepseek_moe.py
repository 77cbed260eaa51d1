"""DeepSeek-MoE port: parity with a float64 NumPy forward, paths, sites, policies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.models import config as mc
from fp8jax.models import deepseek_moe as dm
from fp8jax.models import policy as pl
from tests.references import reference_model


def _setup(seed=0, **changes):
  cfg = mc.tiny(**{"dtype": "float32", **changes})
  params = dm.init(cfg, jax.random.key(seed))
  tokens = jax.random.randint(jax.random.key(seed + 1), (2, 12), 0, cfg.vocab_size)
  return cfg, params, tokens


@pytest.mark.slow
@pytest.mark.parametrize("changes", [
    {}, {"norm_topk_prob": True}, {"seq_aux": False, "num_experts_per_tok": 3},
    {"first_k_dense_replace": 0, "moe_layer_freq": 2, "n_shared_experts": 0},
    {"num_key_value_heads": 2}, {"num_key_value_heads": 1, "norm_topk_prob": True},
])
def test_matches_float64_numpy_forward(changes):
  cfg, params, tokens = _setup(**changes)
  with jax.default_matmul_precision("highest"):  # GPUs default to TF32 for float32
    logits, aux = jax.jit(dm.apply, static_argnums=2)(params, tokens, cfg)
  ref_logits, ref_aux = reference_model.forward(params, np.asarray(tokens), cfg)
  scale = np.max(np.abs(ref_logits))
  np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5 * scale)
  np.testing.assert_allclose(float(aux["aux_loss"]), ref_aux, rtol=1e-5)


@pytest.mark.slow
def test_dispatch_equals_every_expert_reference_with_equal_gradients():
  cfg, params, tokens = _setup(1)
  def loss(p, impl):
    logits, aux = dm.apply(p, tokens, cfg, moe_impl=impl)
    return dm.lm_loss(logits, tokens) + aux["aux_loss"]
  with jax.default_matmul_precision("highest"):
    grads = {impl: jax.jit(jax.grad(loss), static_argnums=1)(params, impl)
             for impl in ("dispatch", "reference")}
  for a, b in zip(jax.tree.leaves(grads["dispatch"]), jax.tree.leaves(grads["reference"])):
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(b)) + 1e-30))


@pytest.mark.slow
def test_routing_outputs():
  cfg, params, tokens = _setup(2)
  _, aux = dm.apply(params, tokens, cfg)
  assert sorted(aux["routing"]) == [1, 2]  # layer 0 is dense
  r = aux["routing"][1]
  assert r["topk_ids"].shape == (2, 12, 2) and r["topk_weights"].shape == (2, 12, 2)
  assert int(r["expert_counts"].sum()) == 2 * 12 * 2
  np.testing.assert_array_equal(
      r["expert_counts"], np.bincount(np.asarray(r["topk_ids"]).ravel(), minlength=8))
  assert float(jnp.max(jnp.sum(r["topk_weights"], -1))) < 1.0  # raw probabilities


@pytest.mark.slow
def test_empty_policy_is_bf16_and_a_site_leaves_upstream_layers_alone():
  cfg, params, tokens = _setup(3, dtype="bfloat16")
  base, base_aux = dm.apply(params, tokens, cfg)
  empty, _ = dm.apply(params, tokens, cfg, pl.PrecisionPolicy(name="nothing"))
  np.testing.assert_array_equal(base, empty)
  pol = pl.site_policy("moe_out", "2", fp8jax.QuantSpec(format="e5m2",
                                                       granularity=fp8jax.per_tensor()))
  quant, q_aux = dm.apply(params, tokens, cfg, pol)
  assert not np.array_equal(base, quant)
  for key in ("topk_ids", "topk_weights"):  # layer 1 is upstream of the site
    np.testing.assert_array_equal(base_aux["routing"][1][key], q_aux["routing"][1][key])
  np.testing.assert_array_equal(base_aux["aux_loss_per_layer"][1],
                                q_aux["aux_loss_per_layer"][1])


@pytest.mark.slow
def test_every_site_changes_the_output_and_reports_telemetry():
  cfg, params, tokens = _setup(4)
  base, _ = dm.apply(params, tokens, cfg)
  spec = fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.tile(32))
  for site, layer in (("attn_out", "0"), ("mlp_out", "0"), ("moe_out", "1"),
                      ("moe_routed_out", "1"), ("moe_shared_out", "2"), ("expert_in", "all")):
    logits, aux = dm.apply(params, tokens, cfg, pl.site_policy(site, layer, spec),
                           telemetry=True)
    assert not np.array_equal(logits, base), site
    names = [k.split("/")[1] for k in aux["telemetry"]]
    assert names and set(names) == {site}


@pytest.mark.slow
def test_policy_validation():
  spec = fp8jax.preset("deepseek_v3")
  assert pl.parse_layers("0-8") == tuple(range(9)) and pl.parse_layers("all") is None
  assert pl.parse_layers("1,3,5-6") == (1, 3, 5, 6)
  with pytest.raises(ValueError, match="unknown quantization site 'ffn_out'"):
    pl.site_policy("ffn_out", "0", spec)
  with pytest.raises(ValueError, match="bad layer set"):
    pl.parse_layers("first")
  cfg, params, tokens = _setup()
  with pytest.raises(ValueError, match="delayed_state does not fit policy .* lacks"):
    dm.apply(params, tokens, cfg, pl.site_policy("attn_out", "0", fp8jax.preset("te_hybrid")))
  with pytest.raises(ValueError, match="names layer 8 but the model has 3 layers"):
    dm.apply(params, tokens, cfg, pl.site_policy("attn_out", "0-8", spec))


@pytest.mark.slow
def test_expert_padding_is_exact():
  cfg, params, tokens = _setup(5)
  padded_cfg = cfg.replace(expert_pad_to=48)
  padded = jax.tree.map(lambda x: x, params)
  for i in (1, 2):
    m = padded["layers"][i]["mlp"]
    m["experts_gate"] = jnp.pad(m["experts_gate"], ((0, 0), (0, 0), (0, 16)))
    m["experts_up"] = jnp.pad(m["experts_up"], ((0, 0), (0, 0), (0, 16)))
    m["experts_down"] = jnp.pad(m["experts_down"], ((0, 0), (0, 16), (0, 0)))
  a, _ = dm.apply(params, tokens, cfg)
  b, _ = dm.apply(padded, tokens, padded_cfg)
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  fresh = dm.init(padded_cfg, jax.random.key(0))
  assert np.all(np.asarray(fresh["layers"][1]["mlp"]["experts_up"])[:, :, 32:] == 0)


@pytest.mark.slow
def test_gemm_hook_routes_linear_layers_through_fp8():
  cfg, params, tokens = _setup(6)
  apply = jax.jit(dm.apply, static_argnums=(2, 3))
  base, _ = apply(params, tokens, cfg, pl.BF16)
  bf16_gemm, _ = apply(params, tokens, cfg, pl.PrecisionPolicy(gemm=fp8jax.gemm.dense.BF16))
  fp8_policy = pl.PrecisionPolicy(gemm=fp8jax.GemmConfig())
  fp8, _ = apply(params, tokens, cfg, fp8_policy)
  assert not np.array_equal(fp8, base)
  rel = lambda a: float(np.linalg.norm(a - base) / np.linalg.norm(base))  # noqa: E731
  assert rel(bf16_gemm) < 2e-2 and 1e-3 < rel(fp8) < 0.2
  grad = jax.jit(jax.grad(lambda p, pol: dm.lm_loss(dm.apply(p, tokens, cfg, pol)[0], tokens)),
                 static_argnums=1)
  g_fp8, g_bf16 = grad(params, fp8_policy), grad(params, pl.BF16)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(g_fp8))
  # The routed experts are hooked too. (The difference can be large: FP8 noise upstream
  # flips some routing decisions, which moves whole tokens between experts.)
  for name in ("experts_gate", "experts_down"):
    a, b = g_fp8["layers"][1]["mlp"][name], g_bf16["layers"][1]["mlp"][name]
    assert 1e-3 < float(np.linalg.norm(a - b) / np.linalg.norm(b)) < 1.0
  with pytest.raises(TypeError, match="gemm must be an fp8jax GemmConfig"):
    pl.PrecisionPolicy(gemm="deepseek_v3")
  with pytest.raises(ValueError, match="no FP8 GEMM hook"):
    dm.apply(params, tokens, cfg, fp8_policy, moe_impl="reference")


@pytest.mark.slow
def test_gemm_hook_hopper_blockwise_is_a_whole_model_policy():
  """``gemm:hopper_blockwise`` (the Hopper tensor-core accumulator, promotion every 128)
  runs forward and backward through every hooked GEMM, the routed experts' grouped GEMM
  included, and differs from FP32 accumulation. ``moe_impl="pallas"`` takes the same
  simulated grouped GEMM (the Pallas kernels accumulate in FP32): the same bits."""
  tc = pl.parse_policy("gemm:hopper_blockwise")
  assert tc.gemm == fp8jax.recipe("hopper_blockwise")
  assert tc.gemm.accumulation == fp8jax.gemm.accumulate.HOPPER
  fp32 = pl.parse_policy("gemm:fp32_blockwise")
  assert fp32.gemm.replace(accumulation=tc.gemm.accumulation) == tc.gemm
  cfg, params, tokens = _setup(6, num_hidden_layers=2)  # a dense layer, then an MoE layer

  def loss(p, pol, impl):
    logits, aux = dm.apply(p, tokens, cfg, pol, moe_impl=impl)
    return dm.lm_loss(logits, tokens) + aux["aux_loss"], logits

  g_tc, y_tc = jax.jit(jax.grad(loss, has_aux=True), static_argnums=(1, 2))(
      params, tc, "dispatch")
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(g_tc))
  for name in ("experts_gate", "experts_up", "experts_down"):
    assert np.any(g_tc["layers"][1]["mlp"][name] != 0), name
  forward = jax.jit(loss, static_argnums=(1, 2))
  _, y_32 = forward(params, fp32, "dispatch")
  assert not np.array_equal(y_tc, y_32)
  assert float(np.linalg.norm(y_tc - y_32) / np.linalg.norm(y_32)) < 0.05
  np.testing.assert_array_equal(forward(params, tc, "pallas")[1],
                                forward(params, tc, "dispatch")[1])


@pytest.mark.slow
@pytest.mark.parametrize("gemm", [None, fp8jax.gemm.dense.FP32_BLOCKWISE])
def test_moe_groups_give_the_same_result(gemm):
  """Dispatching per group of sequences (one group per data-parallel device) changes
  nothing: the same tokens meet the same experts. Only with the FP8 GEMM do the routed
  experts' weight gradients move a little: their 1x128 tiles along the tokens follow the
  groups, as on real data-parallel devices."""
  cfg = mc.tiny(dtype="float32")
  params = dm.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (4, 16), 0, cfg.vocab_size)
  pol = pl.PrecisionPolicy(gemm=gemm, name="g") if gemm else pl.BF16

  def loss(p, groups):
    logits, aux = dm.apply(p, tokens, cfg, pol, moe_groups=groups)
    return dm.lm_loss(logits, tokens) + aux["aux_loss"]

  grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  ref = grad(params, 1)
  for groups in (4,):  # one sequence per group
    got = grad(params, groups)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got[1])[0],
                            jax.tree.leaves(ref[1])):
      if gemm is not None and "experts_" in jax.tree_util.keystr(path):
        assert np.linalg.norm(a - b) < 0.05 * np.linalg.norm(b), path
      else:
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=str(path))
  with pytest.raises(ValueError, match="moe_groups 3 does not divide the batch 4"):
    loss(params, 3)
