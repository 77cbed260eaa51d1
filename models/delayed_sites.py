"""Per-site amax histories: delayed scaling at the model's quantization sites.

A policy whose site rules use delayed scaling (``attn@0:e4m3/delayed(h=16)``, the
``te_hybrid`` preset) quantizes each such (site, layer) with the amax history of the
previous steps there. Its state is a plain pytree, named by site and layer::

    {"attn_out": {0: {"fwd": float32 [h]}}, "moe_out": {1: {"fwd": ..., "bwd": ...}}}

``fwd`` is the history of the forward tensor, ``bwd`` that of the cotangent (each present
only when that direction is delayed-scaled; entry 0 the most recent, all zeros: nothing
recorded yet). Only the (site, layer) pairs the model runs are in it: ``mlp_out`` on dense
layers, the MoE sites on MoE layers (``moe_shared_out`` only with shared experts). For a
policy without delayed scaling the state is ``{}`` and nothing changes.

    state = delayed_sites.init(cfg, policy)
    def loss(params, state):
      logits, aux = deepseek_moe.apply(params, tokens, cfg, policy, delayed_state=state)
      return deepseek_moe.lm_loss(logits, tokens) + aux["aux_loss"]
    grads, state = jax.grad(loss, argnums=(0, 1))(params, state)

The updated state is the gradient with respect to ``state`` (the overwrite-with-gradient
form of :mod:`fp8jax.quant.delayed`: the step quantizes with the histories of earlier
steps, then pushes its tensor's amax and its cotangent's amax). Every history is used once
per forward pass, so its update is exact without max-combining; a forward pass alone
updates nothing.
"""

from __future__ import annotations

import jax.numpy as jnp

import fp8jax
from fp8jax.models import policy as policy_lib
from fp8jax.models import policy_rules
from fp8jax.models.config import ModelConfig
from fp8jax.rules import delayed_outputs
from fp8jax.rules.delayed_outputs import layout  # noqa: F401  (a checkpoint's record of the state)


def runs(cfg: ModelConfig, site: str, layer: int) -> bool:
  """Whether the model passes through ``site`` at ``layer``."""
  if site == "attn_out":
    return True
  if site == "mlp_out":
    return not cfg.is_moe_layer(layer)
  if site not in policy_lib.MOE_SITES:
    raise ValueError(f"unknown quantization site {site!r}; sites: {policy_lib.SITES}")
  return cfg.is_moe_layer(layer) and (site != "moe_shared_out" or cfg.n_shared_experts > 0)


def sites(cfg: ModelConfig, policy) -> dict[tuple[str, int], fp8jax.QuantSpec]:
  """``{(site, layer): spec}`` of every delayed-scaled site the model runs under ``policy``
  (a Variant or a ``PrecisionPolicy``), as its rules decide."""
  decide = policy_rules.decisions(policy, cfg.num_hidden_layers)
  out = {}
  for site in policy_lib.SITES:
    for layer in range(cfg.num_hidden_layers):
      spec = decide.site(site, layer)
      if spec is not None and fp8jax.quant.delayed.needs_state(spec) and runs(cfg, site, layer):
        out[(site, layer)] = spec
  return out


def init(cfg: ModelConfig, policy) -> dict:
  """The empty state of ``policy`` (all-zero histories); ``{}`` without delayed sites."""
  out: dict = {}
  for (site, layer), spec in sites(cfg, policy).items():
    out.setdefault(site, {})[layer] = {
        k: jnp.zeros((n,), jnp.float32) for k, n in delayed_outputs.directions(spec).items()}
  return out


def check(cfg: ModelConfig, policy, state) -> None:
  """Raises ValueError naming the problem when ``state`` is not the state ``policy`` needs
  (a missing or extra site, layer or direction, an unknown site, a wrong history length)."""
  state = {} if state is None else state
  if not isinstance(state, dict):
    raise TypeError(f"delayed_state must be a dict (delayed_sites.init), got {type(state)}")
  for site in state:
    if site not in policy_lib.SITES:
      raise ValueError(f"unknown quantization site {site!r} in delayed_state; sites: "
                       f"{policy_lib.SITES}")
  want = {f"{s}/{i}/{k}": [n] for (s, i), spec in sites(cfg, policy).items()
          for k, n in delayed_outputs.directions(spec).items()}
  got = layout(state)
  if got == want:
    return
  missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
  shapes = sorted(f"{k}: {got[k]} (policy: {want[k]})" for k in set(want) & set(got)
                  if got[k] != want[k])
  problems = ([f"lacks {missing}"] if missing else []) + (
      [f"has histories the policy does not use: {extra}"] if extra else []) + (
      [f"has history shapes {shapes}"] if shapes else [])
  raise ValueError(f"delayed_state does not fit policy {policy.name!r}: it "
                   f"{'; it '.join(problems)}; build it with "
                   "fp8jax.models.delayed_sites.init(cfg, policy)")


def at(state, site: str, layer: int, spec: fp8jax.QuantSpec):
  """The :class:`fp8jax.DelayedState` of (site, layer) for ``fake_quant``; None when
  ``spec`` uses no delayed scaling."""
  if not fp8jax.quant.delayed.needs_state(spec):
    return None
  h = state[site][layer]
  return fp8jax.DelayedState(fwd=h.get("fwd"), bwd=h.get("bwd"))
