"""The noise floor of a comparison: BF16 against itself at weights perturbed at BF16 rounding.

A low-precision gradient differs from the BF16 one by some relative error; whether that
number measures the format or only the checkpoint's sensitivity to ANY perturbation of
that size needs a yardstick. The floor is the same comparison with the second gradient
taken in BF16 at weights ``theta * (1 + u * 2^-8)``, ``u ~ U(-1, 1)`` per element
(:func:`perturb`; 2^-8 is BF16's unit roundoff, so the perturbation is a random
re-rounding of the weights at BF16's own precision). The ratio of a policy's error to the
floor's on the same batch then says how many times the checkpoint's own sensitivity the
policy's effect is.

The floor's gradient difference over the size of its perturbation,
``||g(theta + delta) - g(theta)|| / ||delta||``, is the norm of a Hessian-vector product
along a random direction (to first order): a curvature signal at no extra cost.

Keys are derived from the (checkpoint step, data offset, batch) of a comparison
(:func:`floor_key`), so the floor of a sweep is reproducible and resumable.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp8jax.models import layer_stack

BF16_UNIT_ROUNDOFF = 2.0**-8
"""Unit roundoff of bfloat16 (8 significant bits, round to nearest): the largest relative
error of rounding a float32 value to bfloat16."""

FLOOR = "floor"
"""The name of the floor's rows in a sweep (a reserved policy name)."""


def perturb(params, key: jax.Array, scale: float = BF16_UNIT_ROUNDOFF):
  """``theta * (1 + scale * u)``, ``u ~ U(-1, 1)`` per element (a key per leaf): a random
  relative perturbation of the size of BF16 rounding (``scale``: the unit roundoff).
  Deterministic in ``key``; leaves keep their dtype. Layers stored stacked
  (:mod:`fp8jax.models.layer_stack`) get the draws of the per-layer layout and keep
  their layout."""
  runs = layer_stack.layout(params) if layer_stack.is_stacked(params) else None
  leaves, treedef = jax.tree.flatten(layer_stack.unstack(params) if runs else params)
  keys = jax.random.split(key, len(leaves))
  out = [(x.astype(jnp.float32) * (1.0 + scale * jax.random.uniform(
      k, x.shape, jnp.float32, -1.0, 1.0))).astype(x.dtype) for x, k in zip(leaves, keys)]
  out = jax.tree.unflatten(treedef, out)
  return layer_stack.stack(out, runs) if runs else out


def floor_key(seed: int, step: int, offset: int, batch: int) -> jax.Array:
  """The perturbation key of the floor at checkpoint ``step``, data ``offset`` and
  ``batch`` of a sweep seeded with ``seed``."""
  key = jax.random.key(seed)
  for v in (step, offset, batch):
    key = jax.random.fold_in(key, v)
  return key
