"""A Llama-style dense decoder in Flax NNX, quantized by rules: the model interface
(:mod:`fp8jax.models.api`) on a model that fp8jax's DeepSeek code does not describe.

    model = registry.get("llama:tiny")
    params = model.init(jax.random.key(0))
    logits, _ = model.apply(params, tokens, model.policy("gemm:fp32_blockwise"))

Pre-norm decoder layers (RMSNorm with float32 variance, grouped-query attention with
rotate_half RoPE, SwiGLU MLP), a final norm and an untied head; float32 logits. Its
modules are plain ``nnx.Linear`` layers, so precision reaches them through the rules
engine (:func:`fp8jax.rules.quantize_model`, no edit to this code): module paths
``layers/{i}/attn/{q,k,v,o}``, ``layers/{i}/mlp/{gate,up,down}``, ``head``. Policies
are :class:`fp8jax.models.api.Variant` s, as text in
:mod:`fp8jax.models.rules_policy`'s grammar.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math

from flax import nnx
import jax
import jax.numpy as jnp

from fp8jax import rules as rules_lib
from fp8jax.metrics import paths as paths_lib
from fp8jax.models import api, moe, rules_policy
from fp8jax.models.attention import attention_core, rope
from fp8jax.models.norm import RMSNorm
from fp8jax.quant.delayed import needs_state
from fp8jax.rules import nnx_apply

NAME = "llama"
LAYER_PATH = "layers/{i}/.*"
"""The regex of layer ``{i}``'s modules (a recipe's BF16 layers)."""
SITES = {"attn": "layers/{i}/attn", "mlp": "layers/{i}/mlp"}
"""The site grid's modules: attention and the MLP, at their outputs."""
EXAMPLE_LEN = 16
"""Tokens of the example sequence whose abstract trace finds a policy's delayed-scaled
outputs."""


@dataclasses.dataclass(frozen=True)
class Config:
  """A Llama-style model (frozen, hashable). ``swiglu_limit``: the MLP's SwiGLU
  pre-activations clamped as DeepSeek-V4's (:func:`fp8jax.models.moe.glu`), None: off."""
  vocab_size: int = 320
  hidden_size: int = 64
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  intermediate_size: int = 128
  max_len: int = 128
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  initializer_range: float = 0.02
  param_dtype: str = "float32"
  dtype: str = "bfloat16"
  swiglu_limit: float | None = None

  def __post_init__(self):
    if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
      raise ValueError(f"llama: hidden_size {self.hidden_size} must split into num_heads "
                       f"{self.num_heads}, and those into num_kv_heads {self.num_kv_heads}")
    limit = self.swiglu_limit
    if limit is not None:
      if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 < limit < math.inf:
        raise ValueError(f"llama: swiglu_limit must be None (off) or a finite number > 0, "
                         f"got {limit!r}")
      object.__setattr__(self, "swiglu_limit", float(limit))

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads


CONFIGS = {
    "tiny": Config(),
    "small": Config(vocab_size=8192, hidden_size=512, num_layers=8, num_heads=8,
                    num_kv_heads=4, intermediate_size=1408, max_len=1024),
}


def _linear(cfg: Config, d_in: int, d_out: int, rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(d_in, d_out, use_bias=False, dtype=jnp.dtype(cfg.dtype),
                    param_dtype=jnp.dtype(cfg.param_dtype),
                    kernel_init=nnx.initializers.normal(cfg.initializer_range), rngs=rngs)


class Attention(nnx.Module):
  def __init__(self, cfg: Config, rngs: nnx.Rngs):
    d, d_kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    self.cfg = cfg
    self.q, self.k = _linear(cfg, d, d, rngs), _linear(cfg, d, d_kv, rngs)
    self.v, self.o = _linear(cfg, d, d_kv, rngs), _linear(cfg, d, d, rngs)

  def __call__(self, x):
    b, s, _ = x.shape
    c, pos = self.cfg, jnp.arange(x.shape[1])
    q = rope(self.q(x).reshape(b, s, c.num_heads, c.head_dim), pos, c.rope_theta)
    k = rope(self.k(x).reshape(b, s, c.num_kv_heads, c.head_dim), pos, c.rope_theta)
    v = self.v(x).reshape(b, s, c.num_kv_heads, c.head_dim)
    return self.o(attention_core(q, k, v, "xla").reshape(b, s, c.hidden_size))


class MLP(nnx.Module):
  def __init__(self, cfg: Config, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate, self.up = _linear(cfg, d, f, rngs), _linear(cfg, d, f, rngs)
    self.down = _linear(cfg, f, d, rngs)
    self.limit = cfg.swiglu_limit

  def __call__(self, x):
    return self.down(moe.glu(self.gate(x), self.up(x), self.limit))


class Layer(nnx.Module):
  mlp_cls = MLP  # the feed-forward block (a subclass may take another, e.g. an MoE)

  def __init__(self, cfg: Config, rngs: nnx.Rngs):
    self.attn_norm, self.attn = RMSNorm(cfg), Attention(cfg, rngs)
    self.mlp_norm, self.mlp = RMSNorm(cfg), self.mlp_cls(cfg, rngs)

  def __call__(self, h):
    h = h + self.attn(self.attn_norm(h))
    return h + self.mlp(self.mlp_norm(h))


class Llama(nnx.Module):
  """tokens int [B, S] -> logits float32 [B, S, V]."""
  layer_cls = Layer  # the decoder layer (a subclass may take another)

  def __init__(self, cfg: Config, rngs: nnx.Rngs):
    self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=jnp.dtype(cfg.dtype),
                           param_dtype=jnp.dtype(cfg.param_dtype),
                           embedding_init=nnx.initializers.normal(cfg.initializer_range),
                           rngs=rngs)
    self.layers = nnx.List([self.layer_cls(cfg, rngs) for _ in range(cfg.num_layers)])
    self.norm = RMSNorm(cfg)
    self.head = _linear(cfg, cfg.hidden_size, cfg.vocab_size, rngs)

  def __call__(self, tokens):
    h = self.embed(tokens)
    for layer in self.layers:
      h = layer(h)
    return self.head(self.norm(h)).astype(jnp.float32)


CLASSIFIER = paths_lib.Classifier.from_patterns(
    {"embedding": r"^embed/", "attn_q": r"/attn/q/", "attn_k": r"/attn/k/",
     "attn_v": r"/attn/v/", "attn_o": r"/attn/o/", "mlp": r"/mlp/", "norms": r"norm",
     "head": r"^head/"},
    layer=r"^layers/(\d+)/",
    groups={"attn_q": "attention", "attn_k": "attention", "attn_v": "attention",
            "attn_o": "attention", "mlp": "dense_mlp"})
"""Its parameter paths grouped as the report groups DeepSeek-MoE's dense parts."""


def flops_per_token(cfg: Config, seq_len: int) -> float:
  """Training model FLOPs per token: ``6 * N_matmul + 12 * L * d * S`` (attention core,
  causal masking not discounted); ``N_matmul``: the projections, MLPs and head."""
  d, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
  per_layer = 2 * d * d + 2 * d * kv + 3 * d * cfg.intermediate_size
  matmul = cfg.num_layers * per_layer + d * cfg.vocab_size
  return 6.0 * matmul + 12 * cfg.num_layers * d * seq_len


def model(cfg: Config, name: str = NAME) -> api.Model:
  """The Llama-style model of ``cfg`` as a :class:`~fp8jax.models.api.Model`."""
  return rules_model(cfg, Llama, CLASSIFIER, name, functools.partial(flops_per_token, cfg),
                     sites=SITES)


def rules_model(cfg, module_cls, classifier: paths_lib.Classifier, name: str, flops,
                layer_path: str = LAYER_PATH, sites=None) -> api.Model:
  """The NNX model ``module_cls(cfg, rngs)``, quantized by rules, as a
  :class:`~fp8jax.models.api.Model`: ``cfg`` has ``num_layers``, ``vocab_size`` and
  ``max_len``; the module returns logits, or ``(logits, aux)`` (``aux_loss``,
  ``routing``); ``flops``: ``seq_len -> FLOPs per token``; ``layer_path``: the regex of
  layer ``{i}``'s modules; ``sites``: its site grid's modules (``api.Model.sites``), whose
  cells a policy's record then names (:func:`fp8jax.models.rules_policy.site_cell`)."""
  family = name.partition(":")[0]
  skeleton = nnx.eval_shape(lambda: module_cls(cfg, nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(skeleton, nnx.Param)
  baseline = rules_policy.parse("bf16")

  @functools.cache
  def graph(rules):
    if not len(rules):
      return graphdef
    return nnx.split(rules_lib.quantize_model(skeleton, rules), nnx.Param)[0]

  def forward(params, tokens, rules):
    state = jax.tree.map(lambda x: x, abstract_state)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graph(rules), state)(tokens)

  def apply(params, tokens, policy, *, delayed=None, telemetry=False, param_transform=None,
            **unused):
    """``delayed``: the amax histories of the policy's delayed-scaled outputs
    (``delayed_init(policy)``; their update is the gradient with respect to them)."""
    del telemetry, unused  # no telemetry of its own
    params = api.transform_top_level(params, param_transform)
    with (contextlib.nullcontext() if delayed is None else rules_lib.delayed_scope(delayed)):
      out = forward(params, tokens, policy.rules)
    return out if isinstance(out, tuple) else (out, {})

  example = jax.ShapeDtypeStruct((1, min(EXAMPLE_LEN, cfg.max_len or EXAMPLE_LEN)), jnp.int32)

  @functools.cache
  def delayed_layout(rules):
    """The abstract histories of the delayed-scaled outputs the model runs under ``rules``
    (an abstract trace of one example sequence)."""
    if not any(r.role == "output" and r.action is not None and needs_state(r.action)
               for r in rules):
      return {}
    return api.abstract_of(rules_lib.delayed_init(
        forward, nnx.to_pure_dict(abstract_state), example, rules))

  def delayed_init(policy):
    return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), delayed_layout(policy.rules))

  def init(rng):
    return nnx.to_pure_dict(nnx.state(module_cls(cfg, nnx.Rngs(params=rng)), nnx.Param))

  module_paths = tuple(nnx_apply.module_paths(skeleton))

  def parse(text):
    variant = rules_policy.parse(text, cfg.num_layers, layer_path)
    cell = rules_policy.site_cell(variant.rules, sites or {}, module_paths, cfg.num_layers)
    if cell is not None:
      variant.record["cell"] = cell
    return variant

  def check(policy):
    if not isinstance(policy, api.Variant):
      raise TypeError(f"{family} takes a Variant (rules), got {type(policy).__name__}")
    graph(policy.rules)  # quantize_model raises on a rule that matches no module
    delayed_layout(policy.rules)  # refuses a delayed-scaled module called twice per pass

  param_paths = tuple(paths_lib.flatten(nnx.to_pure_dict(abstract_state)))

  @functools.cache
  def direct(policy):
    plans = rules_lib.plans(skeleton, policy.rules) if len(policy.rules) else {}
    return api.direct_pairs((p for p, plan in plans.items() if not plan.empty),
                            param_paths, classifier)

  def describe(policy):
    return {**api.variant_meta(policy), "direct": sorted(direct(policy), key=str)}

  return api.Model(
      name=name, abstract_params=lambda: nnx.to_pure_dict(abstract_state), apply=apply,
      loss=api.next_token_loss, baseline=baseline, classifier=classifier, init=init,
      vocab_size=cfg.vocab_size, max_len=cfg.max_len, flops_per_token=flops, parse_policy=parse,
      direct=direct, check=check, delayed_init=delayed_init, describe=describe,
      meta=dataclasses.asdict(cfg), config=cfg, sites=dict(sites or {}))
