"""The jitted training step over the functional DeepSeek-MoE facade.

The objective is LM loss + balance loss; both are reported separately. A step whose loss
or gradients are not finite leaves params and optimizer state unchanged and reports which
parameters are non-finite themselves, then which have non-finite gradients
(:func:`first_nonfinite`): a NaN parameter makes most gradients NaN, so the parameters
are checked first.

A policy with delayed-scaled sites carries their amax histories in the train state
(``delayed``, :mod:`fp8jax.models.delayed_sites`; ``{}`` for other policies): each step
quantizes with them and stores the updated histories, except a non-finite step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fp8jax.models import deepseek_moe
from fp8jax.models import policy as policy_lib
from fp8jax.models.config import ModelConfig


class TrainState(NamedTuple):
  step: jax.Array
  params: Any
  opt_state: Any
  delayed: Any = {}  # per-site amax histories (models.delayed_sites); {}: none


def init_state(params, tx: optax.GradientTransformation, delayed=None) -> TrainState:
  """Step 0; ``delayed``: the policy's empty histories (``delayed_sites.init``), if any."""
  return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), delayed or {})


def make_train_step(cfg: ModelConfig, tx: optax.GradientTransformation,
                    policy: policy_lib.PrecisionPolicy = policy_lib.BF16,
                    moe_impl: str = "dispatch", moe_groups: int = 1):
  """Returns ``step(state, tokens) -> (state, metrics)`` (jit it, or shard it);
  ``moe_groups``: the number of data-parallel devices (see ``deepseek_moe.apply``)."""

  def objective(params, delayed, tokens):
    logits, aux = deepseek_moe.apply(params, tokens, cfg, policy, moe_impl=moe_impl,
                                     moe_groups=moe_groups, delayed_state=delayed)
    lm = deepseek_moe.lm_loss(logits, tokens)
    return lm + aux["aux_loss"], (lm, aux["aux_loss"])

  def step(state: TrainState, tokens):
    (loss, (lm, aux)), (grads, delayed) = jax.value_and_grad(
        objective, argnums=(0, 1), has_aux=True)(state.params, state.delayed, tokens)
    all_finite = lambda tree: jax.tree.map(lambda g: jnp.all(jnp.isfinite(g)), tree)  # noqa: E731
    finite_groups = {"params": all_finite(state.params), "grads": all_finite(grads)}
    finite = jnp.isfinite(loss) & jnp.all(jnp.stack(jax.tree.leaves(finite_groups)))
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(  # noqa: E731
        lambda a, b: jnp.where(finite, a, b), new, old)
    new_state = TrainState(state.step + finite.astype(jnp.int32), keep(params, state.params),
                           keep(opt_state, state.opt_state), keep(delayed, state.delayed))
    metrics = {"loss": loss, "lm_loss": lm, "aux_loss": aux,
               "grad_norm": optax.tree.norm(grads), "finite": finite,
               "finite_groups": finite_groups}
    return new_state, metrics

  return step


def first_nonfinite(finite_groups) -> str | None:
  """"params/<path>" of the first non-finite parameter, else "grads/<path>" of the first
  non-finite gradient, else None (host-side, from the step's ``finite_groups``)."""
  for kind in ("params", "grads"):
    for path, ok in jax.tree_util.tree_flatten_with_path(finite_groups[kind])[0]:
      if not bool(ok):
        keys = (str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        return "/".join((kind, *keys))
  return None
