"""The 240 -> 480 range jump at a model site: delayed vs current scaling in the tiny model.

Section 4 of the numerics study jumps a synthetic tensor's range
(:func:`fp8jax.study.formats.fp8_sections.delayed_vs_current`); here the jump happens at a real
quantization site. The tiny DeepSeek-MoE (float32, two layers) runs one fixed batch for a
number of steps with the site ``attn_out`` of layer 0 in E4M3 per-tensor, once with delayed scaling
(its amax history carried from step to step through ``deepseek_moe.apply``'s
``delayed_state``, updated by the backward pass as in training) and once with current
scaling. Before each step layer 0's ``o_proj`` kernel is scaled so that the site's amax
follows a schedule of peaks (the study's ``range_schedule``: 240, a jump to 480, then 960):
the site is linear in that kernel and a doubling is exact, so only the range changes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import fp8jax
from fp8jax.models import config, deepseek_moe, delayed_sites
from fp8jax.models import policy as policy_lib


@functools.partial(jax.jit, static_argnums=(0, 1))
def _step(cfg, policy, params, tokens, state):
  """(logits, telemetry of every site, updated histories) of one step: forward and
  backward with delayed-scaled sites (the backward updates their histories), else forward."""
  def loss(s):
    logits, aux = deepseek_moe.apply(params, tokens, cfg, policy, telemetry=True,
                                     delayed_state=s)
    return deepseek_moe.lm_loss(logits, tokens), (logits, aux["telemetry"])
  if not state:
    return *loss(state)[1], state
  new_state, (logits, tel) = jax.grad(loss, has_aux=True)(state)
  return logits, tel, new_state


def delayed_at_model_site(peaks, seed: int = 0, history_len: int = 16,
                          site: str = "attn_out", layer: int = 0) -> list[dict]:
  """One row per (step, scaling) at ``site`` of ``layer``: the site's amax, its saturated
  elements (count and fraction) and quantization SNR (dB), and the relative L2 error of the
  logits against the unquantized model with the same weights.

  Args:
    peaks: the site's amax at each step (its length is the number of steps).
    seed: params and tokens.
    history_len: the delayed-scaling amax history length.
    site, layer: the quantization site; the jump scales layer ``layer``'s ``o_proj``, so
      ``site`` must be ``attn_out`` of that layer or downstream of it.
  """
  cfg = config.tiny(dtype="float32", num_hidden_layers=2)  # a dense layer, an MoE layer
  params = deepseek_moe.init(cfg, jax.random.key(seed))
  tokens = jax.random.randint(jax.random.key(seed + 1), (2, 32), 0, cfg.vocab_size)
  current = fp8jax.QuantSpec(granularity=fp8jax.per_tensor())
  policies = {
      "delayed": policy_lib.site_policy(site, str(layer), current.replace(
          scaling="delayed", history_len=history_len), name="delayed"),
      "current": policy_lib.site_policy(site, str(layer), current, name="current")}
  key = f"layer_{layer}/{site}"
  kernel = params["layers"][layer]["self_attn"]["o_proj"]["kernel"]
  amax0 = float(_step(cfg, policies["current"], params, tokens, {})[1][key].amax)
  states = {name: delayed_sites.init(cfg, p) for name, p in policies.items()}
  rows = []
  for step, peak in enumerate(peaks):
    scaled = jax.tree.map(lambda x: x, params)
    scaled["layers"][layer]["self_attn"]["o_proj"]["kernel"] = kernel * jnp.float32(
        peak / amax0)
    ref = np.asarray(_step(cfg, policy_lib.BF16, scaled, tokens, {})[0], np.float64)
    for name, pol in policies.items():
      logits, tel, states[name] = _step(cfg, pol, scaled, tokens, states[name])
      t = tel[key]
      n = int(np.prod(ref.shape[:2])) * cfg.hidden_size  # elements at the site
      rows.append({"step": step, "peak": peak, "scaling": name, "amax": float(t.amax),
                   "saturated": int(round(float(t.saturated_frac) * n)),
                   "saturated_frac": float(t.saturated_frac), "snr_db": float(t.snr_db),
                   "logits_rel_err": float(np.linalg.norm(np.asarray(logits) - ref)
                                           / np.linalg.norm(ref))})
  return rows
