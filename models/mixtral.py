"""A Mixtral-style sparse-MoE decoder in Flax NNX, quantized by rules: a Llama-style model
(:mod:`fp8jax.models.llama`) whose MLPs are top-k routed experts.

    model = registry.get("mixtral:tiny")
    params = model.init(jax.random.key(0))
    logits, aux = model.apply(params, tokens, model.policy("gemm:nvfp4_recipe"))
    aux["routing"][0]["topk_ids"]          # int32 [B, S, k]: layer 0's chosen experts

Pre-norm decoder layers: RMSNorm, grouped-query attention with RoPE (Llama's), RMSNorm
and a sparse MoE block: a softmax router over ``num_experts`` experts, the ``top_k``
largest probabilities renormalised to sum to one (Mixtral's), each expert a SwiGLU MLP;
no shared experts. Token-choice, dropless: the (token, slot) pairs are sorted by expert
and go through one grouped GEMM per projection (:func:`fp8jax.models.moe.experts_dispatch`),
the experts' weights stacked ``[E, d, f]`` / ``[E, f, d]``.

Module paths, for rules: ``layers/{i}/attn/{q,k,v,o}`` (``dot_general``),
``layers/{i}/mlp/experts`` (its ``ragged_dot``: the three grouped GEMMs), ``head``. The
router (``layers/{i}/mlp/router``, a parameter of the MoE block) is a plain matmul in the
compute dtype that no rule reaches, as DeepSeek-MoE's. ``apply``'s aux carries, per
layer, the router's choices (``routing``: ``topk_ids`` [B, S, k], ``topk_weights``
[B, S, k], ``expert_counts`` [E]), from which the sweep computes routing divergence and
per-expert metrics, and the load-balancing loss (``aux_loss``: Mixtral's,
``router_aux_loss_coef * E * sum_e f_e P_e`` per layer, summed over the layers).
"""

from __future__ import annotations

import dataclasses
import functools

from flax import nnx
import jax.numpy as jnp

from fp8jax.gemm import grouped as grouped_gemm
from fp8jax.metrics import paths as paths_lib
from fp8jax.models import api, llama, moe

NAME = "mixtral"


@dataclasses.dataclass(frozen=True)
class Config(llama.Config):
  """A Mixtral-style model (frozen, hashable): Llama's fields (``intermediate_size`` is
  each expert's width) and its experts: ``num_experts`` routed experts, ``top_k`` per
  token, the load-balancing loss's ``router_aux_loss_coef``."""
  num_experts: int = 4
  top_k: int = 2
  router_aux_loss_coef: float = 0.02

  def __post_init__(self):
    super().__post_init__()
    if not 1 <= self.top_k <= self.num_experts:
      raise ValueError(f"mixtral: top_k {self.top_k} must be in [1, num_experts "
                       f"{self.num_experts}]")


CONFIGS = {
    "tiny": Config(),
    "small": Config(vocab_size=8192, hidden_size=512, num_layers=8, num_heads=8,
                    num_kv_heads=4, intermediate_size=768, max_len=1024, num_experts=8),
}


class Experts(nnx.Module):
  """``num_experts`` SwiGLU experts, weights stacked (``gate``, ``up`` [E, d, f], ``down``
  [E, f, d]); rows sorted by expert go through ``ragged_dot`` (``x [N, d], w [E, d, f],
  group_sizes [E] -> [N, f]``), the hook a GEMM rule replaces."""

  def __init__(self, cfg: Config, rngs: nnx.Rngs):
    e, d, f = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    init, pdt = nnx.initializers.normal(cfg.initializer_range), jnp.dtype(cfg.param_dtype)
    self.gate = nnx.Param(init(rngs.params(), (e, d, f), pdt))
    self.up = nnx.Param(init(rngs.params(), (e, d, f), pdt))
    self.down = nnx.Param(init(rngs.params(), (e, f, d), pdt))
    self.ragged_dot = grouped_gemm.padded_grouped_matmul
    self.limit = cfg.swiglu_limit

  def __call__(self, x, weights, ids):
    """x [T, d], the top-k ``weights`` float32 [T, k] and expert ``ids`` [T, k] -> [T, d]."""
    w = (self.gate[...], self.up[...], self.down[...])
    return moe.experts_dispatch(x, weights, ids, *(a.astype(x.dtype) for a in w),
                                grouped_matmul=self.ragged_dot, limit=self.limit)


class SparseMoE(nnx.Module):
  """x [B, S, d] -> (out [B, S, d], routing, load-balancing loss)."""

  def __init__(self, cfg: Config, rngs: nnx.Rngs):
    self.cfg = cfg
    init = nnx.initializers.normal(cfg.initializer_range)
    self.router = nnx.Param(init(rngs.params(), (cfg.hidden_size, cfg.num_experts),
                                 jnp.dtype(cfg.param_dtype)))
    self.experts = Experts(cfg, rngs)

  def __call__(self, x):
    b, s, d = x.shape
    c = self.cfg
    flat = x.reshape(b * s, d)
    probs, weights, ids = moe.route(flat, self.router[...], c.top_k, norm_topk_prob=True)
    out = self.experts(flat, weights, ids).reshape(b, s, d)
    routing = {"topk_ids": ids.reshape(b, s, -1), "topk_weights": weights.reshape(b, s, -1),
               "expert_counts": moe.expert_counts(ids, c.num_experts)}
    # DeepSeek's form alpha * sum_e f_e P_e has f_e = count_e / (T k / E): Mixtral's loss
    # (f_e = count_e / T) is it at alpha = coef * k.
    loss = moe.balance_loss(probs, ids, b, c.router_aux_loss_coef * c.top_k, seq_aux=False)
    return out, routing, loss


class Layer(llama.Layer):
  mlp_cls = SparseMoE

  def __call__(self, h):
    h = h + self.attn(self.attn_norm(h))
    out, routing, loss = self.mlp(self.mlp_norm(h))
    return h + out, routing, loss


class Mixtral(llama.Llama):
  """tokens int [B, S] -> (logits float32 [B, S, V], {"aux_loss", "routing"})."""
  layer_cls = Layer

  def __call__(self, tokens):
    h, routing, losses = self.embed(tokens), {}, []
    for i, layer in enumerate(self.layers):
      h, routing[i], loss = layer(h)
      losses.append(loss)
    logits = self.head(self.norm(h)).astype(jnp.float32)
    return logits, {"aux_loss": sum(losses), "routing": routing}


CLASSIFIER = dataclasses.replace(
    paths_lib.Classifier.from_patterns(
        {"embedding": r"^embed/", "attn_q": r"/attn/q/", "attn_k": r"/attn/k/",
         "attn_v": r"/attn/v/", "attn_o": r"/attn/o/", "router": r"/mlp/router$",
         "routed_experts": r"/mlp/experts/", "norms": r"norm", "head": r"^head/"},
        layer=r"^layers/(\d+)/",
        groups={"attn_q": "attention", "attn_k": "attention", "attn_v": "attention",
                "attn_o": "attention", "router": "moe", "routed_experts": "moe"}),
    is_expert_stack=lambda path: "/mlp/experts/" in path)
"""Its parameter paths grouped as the report groups DeepSeek-MoE's: the stacked expert
weights (leading axis: expert) are ``routed_experts``, with per-expert metrics."""
SITES = {"attn": "layers/{i}/attn", "moe": "layers/{i}/mlp"}
"""The site grid's modules: attention and the MoE block, at their outputs."""


def flops_per_token(cfg: Config, seq_len: int) -> float:
  """Training model FLOPs per token: Llama's with the ``top_k`` experts each token
  multiplies in place of its MLP, plus the router."""
  dense = dataclasses.replace(cfg, intermediate_size=cfg.top_k * cfg.intermediate_size)
  return (llama.flops_per_token(dense, seq_len)
          + 6.0 * cfg.num_layers * cfg.hidden_size * cfg.num_experts)


def model(cfg: Config, name: str = NAME) -> api.Model:
  """The Mixtral-style model of ``cfg`` as a :class:`~fp8jax.models.api.Model`."""
  return llama.rules_model(cfg, Mixtral, CLASSIFIER, name,
                           functools.partial(flops_per_token, cfg), sites=SITES)
