"""RMSNorm as DeepSeek-MoE's and Llama's HF code compute it: the variance in float32, the
normalized value cast back to the input's dtype before the weight multiplies it."""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp


class RMSNorm(nnx.Module):
  """x [..., d] -> weight * x / rms(x); ``cfg`` has ``hidden_size`` (d), ``rms_norm_eps``
  and ``param_dtype`` (the weight's, initialised to ones)."""

  def __init__(self, cfg):
    self.eps = cfg.rms_norm_eps
    self.weight = nnx.Param(jnp.ones((cfg.hidden_size,), jnp.dtype(cfg.param_dtype)))

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.weight[...].astype(x.dtype) * y.astype(x.dtype)
