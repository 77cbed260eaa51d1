"""NanoMoE (the ``nano-moe-jax`` package on PyPI): a Flax Linen sparse-MoE language model
that fp8jax did not write, through every binary as the registry's ``nano_moe:tiny``.

    model = registry.get("nano_moe:tiny")           # pip install nano-moe-jax
    params = model.init(jax.random.key(0))
    logits, aux = model.apply(params, tokens, model.policy("gemm:mxfp8"))

``nano_moe.NanoMoE`` is used as published, at random init from its ``NanoMoEConfig``: token
and learned position embeddings, pre-norm blocks of causal multi-head attention (one
``qkv`` Dense, one output Dense) and a top-k MoE layer (a router Dense, ``n_experts``
two-layer GELU experts, every expert computed for every token and the top-k gathered),
a final LayerNorm and an untied head. Precision reaches its GEMMs on the jaxpr route
(:mod:`fp8jax.models.flax_lm`): the parameter paths are Linen's own names,
``block_{i}/MultiHeadAttention_0/Dense_{0,1}``, ``block_{i}/MoELayer_0/Router_0/Dense_0``,
``block_{i}/MoELayer_0/expert_{e}/Dense_{0,1}``, ``Dense_0`` (the head). The params are
float32 and the forward computes in BF16 (``dtype``). ``aux`` carries the load-balancing
loss (times ``aux_loss_coeff``) and each layer's routing (``topk_ids``, ``topk_weights``,
``expert_counts``, from the router's outputs), so the report shows routing divergence.
The package is imported when a model is built: fp8jax works without it.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from fp8jax.metrics import paths as paths_lib
from fp8jax.models import api, flax_lm, registry

FAMILY = "nano_moe"
PACKAGE = "nano-moe-jax>=0.1,<0.2"
LAYER_PATH = "block_{i}/.*"


@dataclasses.dataclass(frozen=True)
class Config:
  """NanoMoE's architecture (the fields of ``nano_moe.NanoMoEConfig`` that shape it; no
  dropout) and the forward's compute dtype."""
  vocab_size: int = 320
  n_layers: int = 2
  n_heads: int = 4
  d_model: int = 64
  d_ff: int = 128
  n_experts: int = 4
  top_k: int = 2
  block_size: int = 128
  aux_loss_coeff: float = 0.01
  dtype: str = "bfloat16"


CONFIGS = {
    "tiny": Config(),
    "small": Config(n_layers=4, d_model=128, d_ff=512),  # the package's default widths
}

CLASSIFIER = paths_lib.Classifier.from_patterns(
    {"embedding": r"^(Embed_0/|pos_emb$)", "attn_qkv": r"/MultiHeadAttention_0/Dense_0/",
     "attn_o": r"/MultiHeadAttention_0/Dense_1/", "router": r"/Router_0/",
     "routed_experts": r"/expert_\d+/", "norms": r"LayerNorm_", "head": r"^Dense_0/"},
    layer=r"^block_(\d+)/",
    groups={"attn_qkv": "attention", "attn_o": "attention", "router": "moe",
            "routed_experts": "moe"})
"""Its parameter paths grouped as the report groups DeepSeek-MoE's."""


def _package():
  try:
    import nano_moe
  except ImportError as e:
    raise ImportError(f"the model family {FAMILY!r} is NanoMoE from the package "
                      f"nano-moe-jax: pip install '{PACKAGE}' (or the dev extra: "
                      "pip install -e '.[dev]')") from e
  return nano_moe


def _routing(intermediates, n_experts: int) -> dict:
  """``{layer: {"topk_ids", "topk_weights", "expert_counts"}}`` from the routers' outputs
  (``(gates, indices, aux_loss)``, captured by Linen)."""
  out = {}
  for name, block in intermediates.items():
    if not name.startswith("block_"):
      continue
    gates, indices, _ = block["MoELayer_0"]["Router_0"]["__call__"][0]
    counts = jnp.zeros((n_experts,), jnp.int32).at[indices.reshape(-1)].add(1)
    out[int(name.removeprefix("block_"))] = {
        "topk_ids": indices.astype(jnp.int32), "topk_weights": gates.astype(jnp.float32),
        "expert_counts": counts}
  return out


def model(cfg: Config, name: str = f"{FAMILY}:tiny") -> api.Model:
  """NanoMoE of ``cfg`` as a :class:`~fp8jax.models.api.Model`."""
  nano_moe = _package()
  module = nano_moe.NanoMoE(nano_moe.NanoMoEConfig(
      vocab_size=cfg.vocab_size, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
      d_model=cfg.d_model, d_ff=cfg.d_ff, n_experts=cfg.n_experts, top_k=cfg.top_k,
      block_size=cfg.block_size, dropout_rate=0.0, aux_loss_coeff=cfg.aux_loss_coeff))
  is_router = lambda mdl, method: isinstance(mdl, nano_moe.Router) and method == "__call__"

  def init(rng):
    return module.init(rng, jnp.zeros((1, cfg.block_size), jnp.int32))["params"]

  def forward(params, tokens):
    (logits, aux_loss), state = module.apply(
        {"params": params}, tokens, capture_intermediates=is_router,
        mutable=["intermediates"])
    return logits, {"aux_loss": cfg.aux_loss_coeff * aux_loss.astype(jnp.float32),
                    "routing": _routing(state["intermediates"], cfg.n_experts)}

  return flax_lm.model(
      name, init=init, forward=forward, classifier=CLASSIFIER, vocab_size=cfg.vocab_size,
      max_len=cfg.block_size, layer_path=LAYER_PATH, compute_dtype=cfg.dtype,
      meta={"model": name, "package": f"nano-moe-jax {_version()}",
            **dataclasses.asdict(cfg)}, config=cfg)


def _version() -> str:
  from importlib import metadata
  try:
    return metadata.version("nano-moe-jax")
  except metadata.PackageNotFoundError:
    return "unknown"


def family(size, overrides, options) -> api.Model:
  """The registry's factory of ``nano_moe:SIZE``."""
  if options:
    raise ValueError(f"the model family {FAMILY!r} has no options {sorted(options)}")
  if size not in CONFIGS:
    raise ValueError(f"unknown {FAMILY} size {size!r}; known: {sorted(CONFIGS)}")
  return model(registry.replace_fields(CONFIGS[size], overrides), name=f"{FAMILY}:{size}")


def sizes() -> tuple[str, ...]:
  return tuple(CONFIGS)

