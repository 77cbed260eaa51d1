"""AdamW with the DeepSeekMoE paper's schedule (arXiv 2401.06066, section 4.1).

Linear warmup to ``peak_lr`` over ``warmup_steps``, constant, then multiplied by
``decay_factor`` (0.316) at 80% and again at 90% of ``total_steps``. Gradients are
clipped to a global norm of ``clip_norm``. Weight decay applies to matrices only (not to
the norm weights, which are vectors). Master params and moments are float32.
"""

from __future__ import annotations

import dataclasses

import jax
import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  peak_lr: float = 1.08e-3
  warmup_steps: int = 2000
  total_steps: int = 10000
  decay_factor: float = 0.316
  decay_at: tuple[float, ...] = (0.8, 0.9)
  b1: float = 0.9
  b2: float = 0.95
  weight_decay: float = 0.1
  clip_norm: float = 1.0

  def __post_init__(self):
    if not 0 <= self.warmup_steps <= self.total_steps:
      raise ValueError(f"warmup_steps {self.warmup_steps} must be in [0, total_steps "
                       f"{self.total_steps}]")
    if any(not 0 < f < 1 for f in self.decay_at):
      raise ValueError(f"decay_at fractions must be in (0, 1), got {self.decay_at}")


def schedule(cfg: OptimConfig) -> optax.Schedule:
  """Learning rate as a function of the step (warmup, then step decay)."""
  warmup = optax.linear_schedule(0.0, cfg.peak_lr, max(cfg.warmup_steps, 1))
  boundaries = {int(f * cfg.total_steps) - cfg.warmup_steps: cfg.decay_factor
                for f in cfg.decay_at}
  steady = optax.piecewise_constant_schedule(cfg.peak_lr, boundaries)
  return optax.join_schedules([warmup, steady], [cfg.warmup_steps])


def optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW (decay on params with 2+ dimensions)."""
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
  return optax.chain(
      optax.clip_by_global_norm(cfg.clip_norm),
      optax.adamw(schedule(cfg), b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
                  mask=decay_mask))
