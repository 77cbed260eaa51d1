"""Plain-NumPy float64 forward of DeepSeek-MoE v1, written from the reference notes.

Independent of the Flax modules: it reads the params dict by name and recomputes every
step in float64 with explicit per-token expert loops; grouped-query attention repeats
the K/V heads explicitly.
"""

from __future__ import annotations

import numpy as np


def _rms(x, w, eps):
  return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def _rope(x, theta):
  s, d = x.shape[1], x.shape[-1]
  inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
  ang = np.arange(s)[:, None] * inv[None, :]
  cos = np.cos(np.concatenate([ang, ang], -1))[None, :, None, :]
  sin = np.sin(np.concatenate([ang, ang], -1))[None, :, None, :]
  half = d // 2
  rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
  return x * cos + rot * sin


def _silu(x):
  return x / (1 + np.exp(-x))


def _swiglu(x, g, u, d, limit=None):
  """SwiGLU; ``limit``: DeepSeek-V4's clamp, the gate from above, the up path both ways."""
  gate, up = x @ g, x @ u
  if limit is not None:
    gate, up = np.minimum(gate, limit), np.clip(up, -limit, limit)
  return (_silu(gate) * up) @ d


def forward(params, tokens, cfg):
  """Returns (logits [B, S, V], total aux loss) in float64."""
  p = lambda a: np.asarray(a, np.float64)  # noqa: E731
  b, s = tokens.shape
  h = p(params["embed_tokens"]["embedding"])[tokens]
  nh, hd = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
  nkv = cfg.num_key_value_heads or nh  # None: multi-head attention
  aux_total = 0.0
  limit = getattr(cfg, "swiglu_limit", None)
  for i in range(cfg.num_hidden_layers):
    lp = params["layers"][i]
    x = _rms(h, p(lp["input_layernorm"]["weight"]), cfg.rms_norm_eps)
    at = lp["self_attn"]
    q = _rope((x @ p(at["q_proj"]["kernel"])).reshape(b, s, nh, hd), cfg.rope_theta)
    k = _rope((x @ p(at["k_proj"]["kernel"])).reshape(b, s, nkv, hd), cfg.rope_theta)
    v = (x @ p(at["v_proj"]["kernel"])).reshape(b, s, nkv, hd)
    # Grouped-query attention: each K/V head serves nh // nkv consecutive query heads.
    k, v = np.repeat(k, nh // nkv, axis=2), np.repeat(v, nh // nkv, axis=2)
    att = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
    att = np.where(np.tril(np.ones((s, s), bool)), att, -np.inf)
    att = np.exp(att - att.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    h = h + np.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, -1) @ p(at["o_proj"]["kernel"])
    x = _rms(h, p(lp["post_attention_layernorm"]["weight"]), cfg.rms_norm_eps)
    mlp = lp["mlp"]
    if not cfg.is_moe_layer(i):
      h = h + _swiglu(x, p(mlp["gate_proj"]["kernel"]), p(mlp["up_proj"]["kernel"]),
                      p(mlp["down_proj"]["kernel"]), limit)
      continue
    flat = x.reshape(b * s, -1)
    logits = flat @ p(mlp["gate"])
    scores = np.exp(logits - logits.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    kk, e = cfg.num_experts_per_tok, cfg.n_routed_experts
    out = np.zeros_like(flat)
    picks = np.zeros((b, e))
    for t in range(b * s):
      top = np.argsort(-scores[t], kind="stable")[:kk]
      w = scores[t, top]
      if cfg.norm_topk_prob and kk > 1:
        w = w / (w.sum() + 1e-20)
      for ex, wt in zip(top, w):
        out[t] += wt * _swiglu(flat[t], p(mlp["experts_gate"][ex]), p(mlp["experts_up"][ex]),
                               p(mlp["experts_down"][ex]), limit)
        picks[t // s if cfg.seq_aux else 0, ex] += 1
    if cfg.n_shared_experts:
      sh = mlp["shared_experts"]
      out += _swiglu(flat, p(sh["gate_proj"]["kernel"]), p(sh["up_proj"]["kernel"]),
                     p(sh["down_proj"]["kernel"]), limit)
    if cfg.aux_loss_alpha > 0:
      if cfg.seq_aux:
        ce = picks / (s * kk / e)
        pi = scores.reshape(b, s, e).mean(1)
        aux_total += cfg.aux_loss_alpha * np.mean(np.sum(ce * pi, -1))
      else:
        ce = picks[0] / (b * s * kk / e)
        aux_total += cfg.aux_loss_alpha * np.sum(ce * scores.mean(0))
    h = h + out.reshape(b, s, -1)
  h = _rms(h, p(params["norm"]["weight"]), cfg.rms_norm_eps)
  return h @ p(params["lm_head"]["kernel"]), aux_total
