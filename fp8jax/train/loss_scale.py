"""Dynamic loss scaling: the classic FP16 mixed-precision baseline.

With FP16 compute (``model_overrides.dtype="float16"``) small gradients underflow, so the
step differentiates ``loss * S`` and divides the gradients by ``S`` (float32, exact for a
power of two). ``S`` adapts:

* a step whose loss or gradients are not finite is skipped (params, optimizer state and
  delayed-scaling histories unchanged), ``S`` is divided by ``factor`` (2) and the run goes
  on; the skipped steps are counted;
* after ``growth_interval`` consecutive finite steps ``S`` is multiplied by ``factor``
  (not past the float32 range);
* a non-finite step that would take ``S`` below ``minimum`` cannot be absorbed: the step
  reports it (``absorbed`` False) and the training loop stops with ``NonFiniteError``.

The state is a dict in ``TrainState.loss_scale`` (checkpointed with the run):
``scale`` float32 [], ``good_steps`` int32 [] (finite steps since ``S`` last changed),
``skipped`` int32 [] (skipped steps since step 0).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
  """Static settings of dynamic loss scaling (``precision.loss_scale*`` of a run config)."""

  init: float = 2.0**15
  growth_interval: int = 2000
  minimum: float = 1.0
  factor: float = 2.0

  def __post_init__(self):
    if not (math.isfinite(self.minimum) and 0 < self.minimum <= self.init < math.inf):
      raise ValueError(f"loss scale: need 0 < minimum {self.minimum} <= init {self.init} "
                       "< inf")
    if not isinstance(self.growth_interval, int) or self.growth_interval < 1:
      raise ValueError(f"loss scale: growth_interval must be an integer >= 1, got "
                       f"{self.growth_interval!r}")
    if not self.factor > 1:
      raise ValueError(f"loss scale: factor must be > 1, got {self.factor}")

  def init_state(self) -> dict:
    """The state at step 0."""
    return {"scale": jnp.float32(self.init), "good_steps": jnp.int32(0),
            "skipped": jnp.int32(0)}

  def unscale(self, grads, state: dict):
    """float32 ``grads / S`` (the gradients of ``loss * S``)."""
    return jax.tree.map(lambda g: g.astype(jnp.float32) / state["scale"], grads)

  def update(self, state: dict, finite: jax.Array) -> tuple[dict, jax.Array]:
    """(the state after a step, whether that step is absorbed): ``finite`` or a back-off
    that keeps ``S >= minimum`` (then ``S`` stays at the larger of the two)."""
    scale, good = state["scale"], state["good_steps"] + 1
    grown = scale * self.factor
    grow = (good >= self.growth_interval) & jnp.isfinite(grown)
    backed_off = scale / self.factor
    new_scale = jnp.where(finite, jnp.where(grow, grown, scale),
                          jnp.maximum(backed_off, self.minimum))
    new = {"scale": new_scale.astype(jnp.float32),
           "good_steps": jnp.where(finite & ~grow, good, 0).astype(jnp.int32),
           "skipped": state["skipped"] + (~finite).astype(jnp.int32)}
    return new, finite | (backed_off >= self.minimum)
