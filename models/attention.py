"""The attention core of DeepSeek-MoE: rotate_half RoPE and causal softmax attention, through
XLA or cuDNN's flash attention."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """rotate_half RoPE over the whole head: x [B, S, H, D], positions [S]."""
  d = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  cos = jnp.cos(emb).astype(x.dtype)[None, :, None, :]
  sin = jnp.sin(emb).astype(x.dtype)[None, :, None, :]
  x1, x2 = jnp.split(x, 2, axis=-1)
  return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def cudnn_applies(q: jax.Array) -> bool:
  """Whether cuDNN flash attention takes q [B, S, H, D] here: a CUDA GPU backend, bf16 or
  f16 activations and a head size that is a multiple of 8, at most 128."""
  d = q.shape[-1]
  return (jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
          and d % 8 == 0 and d <= 128)


def attention_core(q: jax.Array, k: jax.Array, v: jax.Array, impl: str = "auto"
                   ) -> jax.Array:
  """Causal softmax attention: q [B, S, H, D], k, v [B, S, K, D] -> [B, S, H, D] in q's
  dtype. K < H (dividing it) is grouped-query attention: query head h reads key/value
  head h // (H // K).

  ``impl`` "xla": float32 logits scaled by 1/sqrt(D), softmax in float32, probabilities
  cast to q's dtype before the second product, K/V never repeated in memory; "cudnn":
  cuDNN's fused flash attention (float32 softmax statistics, no [B, H, S, S] tensor in
  memory, grouped heads natively); "auto": cuDNN when :func:`cudnn_applies`, else XLA.
  """
  if impl == "cudnn" or (impl == "auto" and cudnn_applies(q)):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
  b, s, h, hd = q.shape
  kv = k.shape[2]
  qg = q.reshape(b, s, kv, h // kv, hd)  # head h = (h // G, h % G)
  logits = jnp.einsum("bqkgd,bskd->bkgqs", qg, k).astype(jnp.float32) / jnp.sqrt(
      jnp.float32(hd))
  causal = jnp.tril(jnp.ones((s, s), bool))
  probs = jax.nn.softmax(jnp.where(causal, logits, -jnp.inf), axis=-1).astype(q.dtype)
  return jnp.einsum("bkgqs,bskd->bqkgd", probs, v).reshape(b, s, h, hd)
