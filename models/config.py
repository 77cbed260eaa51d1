"""DeepSeek-MoE (v1) configurations and parameter counts.

Field names follow the HF ``config.json`` of ``deepseek-ai/deepseek-moe-16b-base``.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

ATTENTION_IMPLS = ("auto", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A DeepSeek-MoE v1 model (frozen, hashable).

  Layer ``i`` is MoE iff ``n_routed_experts > 0``, ``i >= first_k_dense_replace`` and
  ``i % moe_layer_freq == 0``; other layers use a dense SwiGLU of ``intermediate_size``.
  ``expert_pad_to`` rounds the expert width up with zero weights (exact), e.g. 853 -> 896.
  ``attention_impl`` picks the attention core: "xla" (einsum + softmax, float32 logits),
  "cudnn" (``jax.nn.dot_product_attention``'s cuDNN flash attention: GPU, bf16/f16) or
  "auto" (cuDNN where it applies, else XLA); all compute the same function.
  ``num_key_value_heads`` < ``num_attention_heads`` is grouped-query attention: query head
  ``h`` reads key/value head ``h // (num_attention_heads // num_key_value_heads)``. None
  (the default) is multi-head attention; a value equal to ``num_attention_heads`` is
  stored as None, so equal models compare equal. :attr:`kv_heads` is the count.
  ``swiglu_limit`` clamps every SwiGLU's pre-activations before ``silu(gate) * up`` (dense
  layers, shared and routed experts), as DeepSeek-V4's experts do (``swiglu_limit`` 10 in
  its config): the gate to ``min(gate, limit)``, the up path to ``[-limit, limit]``
  (:func:`fp8jax.models.moe.glu`); None (the default) leaves them unclamped.
  """

  vocab_size: int
  hidden_size: int
  num_hidden_layers: int
  num_attention_heads: int
  intermediate_size: int
  moe_intermediate_size: int
  n_routed_experts: int
  n_shared_experts: int
  num_experts_per_tok: int
  num_key_value_heads: int | None = None
  first_k_dense_replace: int = 0
  moe_layer_freq: int = 1
  norm_topk_prob: bool = False
  aux_loss_alpha: float = 0.001
  seq_aux: bool = True
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  max_position_embeddings: int = 4096
  initializer_range: float = 0.006
  expert_pad_to: int | None = None
  param_dtype: str = "float32"
  dtype: str = "bfloat16"
  attention_impl: str = "auto"
  swiglu_limit: float | None = None

  def __post_init__(self):
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                       f"num_attention_heads {self.num_attention_heads}")
    kv = self.num_key_value_heads
    if kv is not None and (kv < 1 or self.num_attention_heads % kv):
      raise ValueError(f"num_key_value_heads must be >= 1 and divide num_attention_heads "
                       f"{self.num_attention_heads}, got {kv}")
    if kv == self.num_attention_heads:
      object.__setattr__(self, "num_key_value_heads", None)  # canonical MHA
    if self.n_routed_experts and not 0 < self.num_experts_per_tok <= self.n_routed_experts:
      raise ValueError(f"num_experts_per_tok must be in [1, n_routed_experts], got "
                       f"{self.num_experts_per_tok} of {self.n_routed_experts}")
    if self.moe_layer_freq < 1:
      raise ValueError(f"moe_layer_freq must be >= 1, got {self.moe_layer_freq}")
    if self.expert_pad_to is not None and self.expert_pad_to < self.moe_intermediate_size:
      raise ValueError(f"expert_pad_to {self.expert_pad_to} is below moe_intermediate_size "
                       f"{self.moe_intermediate_size}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got "
                       f"{self.attention_impl!r}")
    limit = self.swiglu_limit
    if limit is not None:
      if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 < limit < math.inf:
        raise ValueError(f"swiglu_limit must be None (off) or a finite number > 0, got "
                         f"{limit!r}")
      object.__setattr__(self, "swiglu_limit", float(limit))  # 10 and 10.0: one model
    for name in ("param_dtype", "dtype"):
      jnp.dtype(getattr(self, name))  # raises TypeError on unknown dtypes

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def kv_heads(self) -> int:
    """Key/value heads (``num_attention_heads`` without grouped-query attention)."""
    return self.num_key_value_heads or self.num_attention_heads

  @property
  def expert_width(self) -> int:
    """Stored expert width (moe_intermediate_size, or padded)."""
    return self.expert_pad_to or self.moe_intermediate_size

  def is_moe_layer(self, i: int) -> bool:
    return (self.n_routed_experts > 0 and i >= self.first_k_dense_replace
            and i % self.moe_layer_freq == 0)

  def replace(self, **changes) -> ModelConfig:
    return dataclasses.replace(self, **changes)


def tiny(**changes) -> ModelConfig:
  """A 3-layer model for CPU tests: a dense first layer, then MoE layers. Its vocabulary
  (320) holds the byte tokenizer (257 ids)."""
  base = ModelConfig(vocab_size=320, hidden_size=64, num_hidden_layers=3,
                     num_attention_heads=4, intermediate_size=96, moe_intermediate_size=32,
                     n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                     first_k_dense_replace=1, aux_loss_alpha=0.01,
                     max_position_embeddings=128, initializer_range=0.02)
  return base.replace(**changes)


def deepseek_moe_2b(**changes) -> ModelConfig:
  """The DeepSeekMoE paper's 2B validation model (arXiv 2401.06066)."""
  base = ModelConfig(vocab_size=8192, hidden_size=1280, num_hidden_layers=9,
                     num_attention_heads=10, intermediate_size=3412,
                     moe_intermediate_size=853, n_routed_experts=63, n_shared_experts=1,
                     num_experts_per_tok=7, first_k_dense_replace=0, aux_loss_alpha=0.01,
                     max_position_embeddings=2048, initializer_range=0.006)
  return base.replace(**changes)


def deepseek_moe_16b(**changes) -> ModelConfig:
  """The public deepseek-moe-16b-base configuration."""
  base = ModelConfig(vocab_size=102400, hidden_size=2048, num_hidden_layers=28,
                     num_attention_heads=16, intermediate_size=10944,
                     moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2,
                     num_experts_per_tok=6, first_k_dense_replace=1, aux_loss_alpha=0.001,
                     max_position_embeddings=4096, initializer_range=0.02)
  return base.replace(**changes)


CONFIGS = {"tiny": tiny, "deepseek_moe_2b": deepseek_moe_2b,
           "deepseek_moe_16b": deepseek_moe_16b}


def get_config(name: str, **changes) -> ModelConfig:
  if name not in CONFIGS:
    raise ValueError(f"unknown model config {name!r}; known: {sorted(CONFIGS)}")
  return CONFIGS[name](**changes)


def param_counts(cfg: ModelConfig) -> dict:
  """Parameter counts (unpadded widths): total and activated per token.

  Activated counts the embedding row, the head, attention, norms, the router, the shared
  experts and ``num_experts_per_tok`` routed experts of every MoE layer.
  """
  d, f = cfg.hidden_size, cfg.moe_intermediate_size
  attn = 2 * d * d + 2 * d * cfg.kv_heads * cfg.head_dim  # q, o; k, v
  norms = 2 * d
  total = active = 2 * cfg.vocab_size * d + d  # embedding, head, final norm
  for i in range(cfg.num_hidden_layers):
    if cfg.is_moe_layer(i):
      expert = 3 * d * f
      shared = 3 * d * f * cfg.n_shared_experts
      router = cfg.n_routed_experts * d
      total += attn + norms + router + shared + cfg.n_routed_experts * expert
      active += attn + norms + router + shared + cfg.num_experts_per_tok * expert
    else:
      dense = 3 * d * cfg.intermediate_size
      total += attn + norms + dense
      active += attn + norms + dense
  return {"total": total, "activated": active}
