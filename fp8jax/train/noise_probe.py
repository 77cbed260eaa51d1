"""The gradient's signal-to-quantization-noise ratio along a training run.

"FP4 All the Way" (arXiv 2505.19115) finds that FP4 training stops improving once the
gradient's norm falls below about sqrt(3) times the norm of the quantization noise in it.
With ``train.noise_probe_every = N`` (a multiple of ``train.log_every``), every N-th step
of a low-precision run also takes the BF16 gradient of the same objective on the same batch
at the same params, and logs

- ``probe/grad_norm``: ``||g_bf16||``, the global L2 norm over every parameter;
- ``probe/noise_norm``: ``||g_policy - g_bf16||``, the quantization noise's norm;
- ``probe/ratio``: their ratio (``inf`` when the two gradients are equal).

Both gradients are of the training objective (LM + balance loss), without loss scaling and
before clipping; the policy's delayed-scaling histories are read, not updated. The probe
costs two more gradients per probe step, and its own compilation. BF16 runs are not probed.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from fp8jax.models import layer_stack
from fp8jax.train import data_parallel as dp

SQRT3 = math.sqrt(3.0)
"""The ratio below which FP4 training stopped improving (arXiv 2505.19115)."""


def make_probe(model, policy, moe_groups: int = 1, mesh=None, replicas: int | None = None):
  """``probe(params, delayed, tokens int [B, S]) -> {"probe/grad_norm", "probe/noise_norm",
  "probe/ratio"}`` (float32 scalars; jit it) of ``model`` (a
  :class:`fp8jax.models.api.Model`) under ``policy``; ``moe_groups`` goes to its ``apply``
  (DeepSeek-MoE's MoE dispatch groups); ``mesh``: each device takes the gradients of its
  own rows (:mod:`fp8jax.train.data_parallel`; then ``moe_groups`` is 1; ``replicas``:
  their number, default one per device), or None."""

  groups = {} if moe_groups == 1 else {"moe_groups": moe_groups}

  def grads(params, delayed, tokens, pol):
    def objective(p):
      logits, aux = model.apply(p, tokens, pol, delayed=delayed, **groups)
      return model.loss(logits, tokens) + aux.get("aux_loss", 0.0)
    return jax.tree.map(lambda g: g.astype(jnp.float32), jax.grad(objective)(params))

  def local(params, delayed, tokens):
    return grads(params, {}, tokens, model.baseline), grads(params, delayed, tokens, policy)

  both = local if mesh is None else dp.per_device(
      lambda *args: dp.mean(local(*args)), mesh, in_specs=(dp.SAME, dp.SAME, dp.ROWS),
      out_specs=dp.SAME, replicas=replicas)

  def probe(params, delayed, tokens):
    # summed leaf by leaf of the per-layer layout, whatever the params' layout
    reference, quantized = layer_stack.unstack(both(params, delayed, tokens))
    signal = optax.tree.norm(reference)
    noise = optax.tree.norm(jax.tree.map(jnp.subtract, quantized, reference))
    ratio = jnp.where(noise > 0, signal / noise, jnp.inf)
    return {"probe/grad_norm": signal, "probe/noise_norm": noise, "probe/ratio": ratio}

  return probe


def is_due(done: int, every: int) -> bool:
  """Whether the step that makes ``done`` updates is probed (``every`` 0: never)."""
  return every > 0 and done % every == 0


def crossing(rows, threshold: float = SQRT3) -> int | None:
  """The first logged step whose ``probe/ratio`` is below ``threshold`` (None: never)."""
  for row in rows:
    ratio = row.get("probe/ratio")
    if ratio is not None and ratio < threshold:
      return int(row["step"])
  return None


class Probed:
  """``step(state, tokens) -> (state, metrics)`` that, on every ``every``-th call counted
  from step ``start``, first runs ``probe`` on the state's params and delayed histories
  and the same batch, and adds its scalars to the metrics."""

  def __init__(self, step_fn, probe, every: int, start: int):
    self.step_fn, self.probe, self.every, self.done = step_fn, jax.jit(probe), every, start

  def __call__(self, state, tokens):
    self.done += 1
    extra = (self.probe(state.params, state.delayed, tokens) if is_due(self.done, self.every)
             else {})
    state, metrics = self.step_fn(state, tokens)
    return state, {**metrics, **extra}


def wrap(step_fn, cfg, model, policy, mesh, start: int):
  """``step_fn`` probed as the run config ``cfg`` asks (``train.noise_probe_every``), on
  the devices of ``mesh`` as the step runs (per device, or partitioned by XLA with
  ``train.fsdp``); a BF16 run has no quantization noise and is not probed."""
  every = int(cfg.train.noise_probe_every)
  if not every or policy == model.baseline:
    return step_fn
  per_device = not cfg.train.fsdp
  probe = make_probe(model, policy, moe_groups=1 if per_device else mesh.devices.size,
                     mesh=mesh if per_device else None, replicas=cfg.train.replicas or None)
  return Probed(step_fn, probe, every, start)
