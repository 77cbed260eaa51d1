"""NanoMoE from ``nano-moe-jax`` as the registry's ``nano_moe`` (models/thirdparty_nano_moe.py):
its parameter paths classified, every GEMM on a parameter reached by its policies, its
forward the package's own module in BF16 with the routing read from its routers, and a
clear error without the package."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax import rules as rules_lib
from fp8jax.metrics import paths as paths_lib
from fp8jax.models import registry, thirdparty_nano_moe

nano_moe = pytest.importorskip("nano_moe", reason="nano-moe-jax is in the dev extra")
TOKENS = jax.random.randint(jax.random.key(1), (2, 16), 0, 320, dtype=jnp.int32)


@pytest.mark.slow
def test_its_paths_are_classified_and_every_gemm_on_a_parameter_is_reached():
  model = registry.get("nano_moe:tiny")
  flat = paths_lib.flatten(model.abstract_params())
  got = {p: (model.classifier.module_of(p), model.classifier.layer_of(p)) for p in flat}
  assert "other" not in {m for m, _ in got.values()}
  assert got["block_1/MultiHeadAttention_0/Dense_0/kernel"] == ("attn_qkv", 1)
  assert got["block_0/MoELayer_0/Router_0/Dense_0/kernel"] == ("router", 0)
  assert got["block_1/MoELayer_0/expert_3/Dense_1/bias"] == ("routed_experts", 1)
  assert got["Dense_0/kernel"] == ("head", None) and got["pos_emb"] == ("embedding", None)
  # the jaxpr route sees each of the 23 GEMMs on a parameter, and the policy quantizes all
  policy = model.policy("gemm:mxfp8")
  text = rules_lib.describe(lambda p, t: model.apply(p, t, model.baseline), policy.rules,
                            model.abstract_params(), TOKENS)
  assert "23 on parameters, 23 quantized" in text.splitlines()[0]
  gemm_modules = {(m, i) for m, i in got.values() if m not in ("embedding", "norms")}
  assert model.direct(policy) == gemm_modules
  experts = model.policy(r"gemm:mxfp8@block_\d+/MoELayer_0/expert_\d+/.*")
  assert model.direct(experts) == {("routed_experts", 0), ("routed_experts", 1)}
  assert model.direct(model.policy("gemm:nvfp4_recipe")) == {
      (m, i) for m, i in gemm_modules if i != 1}  # its last layer kept in BF16
  with pytest.raises(ValueError, match="matches no GEMM"):
    model.policy("gemm:mxfp8@block_0/MoELayer_0/expert_9/.*")


@pytest.mark.slow
def test_its_forward_is_the_packages_module_in_bf16_with_its_routing():
  cfg = thirdparty_nano_moe.CONFIGS["tiny"]
  model = registry.get("nano_moe:tiny")
  params = model.init(jax.random.key(0))
  module = nano_moe.NanoMoE(nano_moe.NanoMoEConfig(
      vocab_size=cfg.vocab_size, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
      d_model=cfg.d_model, d_ff=cfg.d_ff, n_experts=cfg.n_experts, top_k=cfg.top_k,
      block_size=cfg.block_size, dropout_rate=0.0))
  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  want, want_aux = jax.jit(module.apply)({"params": bf16}, TOKENS)
  apply = jax.jit(model.apply, static_argnums=2)
  logits, aux = apply(params, TOKENS, model.baseline)
  np.testing.assert_array_equal(logits, want.astype(jnp.float32))
  np.testing.assert_allclose(aux["aux_loss"], cfg.aux_loss_coeff * want_aux, rtol=1e-6)
  assert sorted(aux["routing"]) == [0, 1]
  for r in aux["routing"].values():
    assert r["topk_ids"].shape == (2, 16, cfg.top_k) and r["expert_counts"].shape == (4,)
    assert int(r["expert_counts"].sum()) == 2 * 16 * cfg.top_k
    np.testing.assert_array_equal(r["expert_counts"],
                                  np.bincount(np.ravel(r["topk_ids"]), minlength=4))
  quantized, _ = apply(params, TOKENS, model.policy("gemm:nvfp4"))
  assert np.isfinite(quantized).all() and not np.array_equal(quantized, logits)
  assert model.flops_per_token(128) > 6 * sum(
      int(np.prod(p.shape)) for k, p in paths_lib.flatten(params).items()
      if k.endswith("kernel") and "/expert_" not in k)


def test_sizes_overrides_and_the_missing_package(monkeypatch):
  model = registry.get("nano_moe:small", overrides={"n_experts": 2})
  assert model.config.n_experts == 2 and model.meta["d_model"] == 128
  assert model.meta["package"].startswith("nano-moe-jax ")
  with pytest.raises(ValueError, match="unknown model_overrides keys"):
    registry.get("nano_moe:tiny", overrides={"experts": 2})
  with pytest.raises(ValueError, match="has no options"):
    registry.get("nano_moe:tiny", options={"moe_impl": "pallas"})
  monkeypatch.setitem(sys.modules, "nano_moe", None)  # as if it were not installed
  assert "nano_moe:tiny" in registry.known()
  with pytest.raises(ImportError, match=r"pip install 'nano-moe-jax>=0\.1,<0\.2'"):
    registry.get("nano_moe:tiny")
