"""AdamW with the DeepSeekMoE paper's schedule (arXiv 2401.06066, section 4.1).

Linear warmup to ``peak_lr`` over ``warmup_steps``, constant, then multiplied by
``decay_factor`` (0.316) at 80% and again at 90% of ``total_steps``. Gradients are
clipped to a global norm of ``clip_norm``. Weight decay applies to matrices only (not to
the norm weights, which are vectors). By default master params and moments are float32.

``optimizer(cfg, moments_dtype="bfloat16")`` stores both AdamW moments in BF16, as
DeepSeek-V3 does (:func:`scale_by_adam`: each step computes them in float32 from the stored
ones, uses those float32 values for its update, and stores them rounded to nearest even).
With BF16 master weights the step gives this optimizer float32 gradients and params and
``optax.apply_updates`` rounds ``p + update`` (float32) to BF16, to nearest even.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax

from fp8jax.models import layer_stack


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
    for name in ("peak_lr", "decay_factor", "weight_decay", "clip_norm"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int | float) or not (
          0 <= value < math.inf):
        raise ValueError(f"optim.{name} must be a finite number >= 0, got {value!r}")
    for name in ("b1", "b2"):
      if not 0 <= getattr(self, name) < 1:
        raise ValueError(f"optim.{name} must be in [0, 1), got {getattr(self, name)!r}")


def schedule(cfg: OptimConfig) -> optax.Schedule:
  """Learning rate as a function of the step (warmup, then step decay)."""
  warmup = optax.linear_schedule(0.0, cfg.peak_lr, max(cfg.warmup_steps, 1))
  boundaries = {int(f * cfg.total_steps) - cfg.warmup_steps: cfg.decay_factor
                for f in cfg.decay_at}
  steady = optax.piecewise_constant_schedule(cfg.peak_lr, boundaries)
  return optax.join_schedules([warmup, steady], [cfg.warmup_steps])


def scale_by_adam(b1: float, b2: float, eps: float = 1e-8,
                  moments_dtype=jnp.float32) -> optax.GradientTransformation:
  """``optax.scale_by_adam`` (same state type) with both moments stored in
  ``moments_dtype``: computed in float32 from the stored moments, the update uses the
  float32 values, the state keeps them cast (round to nearest even)."""
  dtype = jnp.dtype(moments_dtype)

  def init(params):
    zeros = lambda p: jnp.zeros(p.shape, dtype)  # noqa: E731
    return optax.ScaleByAdamState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params),
                                  jax.tree.map(zeros, params))

  def update(grads, state, params=None):
    del params
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    mu = jax.tree.map(lambda g, m: b1 * f32(m) + (1 - b1) * f32(g), grads, state.mu)
    nu = jax.tree.map(lambda g, v: b2 * f32(v) + (1 - b2) * jnp.square(f32(g)), grads,
                      state.nu)
    count = optax.safe_increment(state.count)
    c1, c2 = 1 - b1 ** f32(count), 1 - b2 ** f32(count)
    updates = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
    cast = lambda t: jax.tree.map(lambda x: x.astype(dtype), t)  # noqa: E731
    return updates, optax.ScaleByAdamState(count, cast(mu), cast(nu))

  return optax.GradientTransformation(init, update)


def optimizer(cfg: OptimConfig, moments_dtype=None) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW (decay on params with 2+ dimensions). Moments:
  optax's (the params' dtype) for ``moments_dtype=None``, else :func:`scale_by_adam`'s
  in that dtype (the same state structure)."""
  decay_mask = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731  # per layer
      lambda path, p: p.ndim - layer_stack.in_run(path) >= 2, params)
  if moments_dtype is None:
    adamw = optax.adamw(schedule(cfg), b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
                        mask=decay_mask)
  else:
    adamw = optax.chain(scale_by_adam(cfg.b1, cfg.b2, moments_dtype=moments_dtype),
                        optax.add_decayed_weights(cfg.weight_decay, decay_mask),
                        optax.scale_by_learning_rate(schedule(cfg)))
  return optax.chain(clip_by_global_norm(cfg.clip_norm), adamw)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """``optax.clip_by_global_norm`` with the norm summed leaf by leaf of the per-layer
  layout, whatever the layout of the layers (:mod:`fp8jax.models.layer_stack`): params
  stored stacked clip as stored per layer, to the bit."""
  def update(updates, state, params=None):
    del params
    norm = layer_stack.global_norm(updates)
    keep = norm < max_norm
    return jax.tree.map(
        lambda t: jax.lax.select(keep, t, (t / norm.astype(t.dtype)) * max_norm),
        updates), state
  return optax.GradientTransformation(optax.init_empty_state, update)
