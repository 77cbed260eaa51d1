"""The optimizer's own pieces (``fp8jax.train.optim``) against hand-computed values."""

import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp8jax.train import optim


def test_clip_by_global_norm_scales_only_above_the_limit():
  """Leaves [3, 4] and [[12]]: global norm sqrt(9 + 16 + 144) = 13."""
  grads = {"a": jnp.asarray([3.0, 4.0]), "b": jnp.asarray([[12.0]])}
  tx = optim.clip_by_global_norm(1.0)
  clipped, _ = tx.update(grads, tx.init(grads))
  np.testing.assert_allclose(clipped["a"], [3 / 13, 4 / 13], rtol=1e-6)
  np.testing.assert_allclose(clipped["b"], [[12 / 13]], rtol=1e-6)
  kept, _ = optim.clip_by_global_norm(20.0).update(grads, tx.init(grads))
  np.testing.assert_array_equal(kept["a"], [3.0, 4.0])
  np.testing.assert_array_equal(kept["b"], [[12.0]])


def test_scale_by_adam_two_steps_by_hand():
  """Adam with bias correction, b1 = 0.5, b2 = 0.75, eps = 0: after g1 = 2 the update is
  sign(g) = 1; after g2 = 4: mu = 2.5, nu = 4.75, c1 = 0.75, c2 = 0.4375, so the update
  is (2.5 / 0.75) / sqrt(4.75 / 0.4375). bfloat16 moments keep these exactly."""
  for dtype in (jnp.float32, jnp.bfloat16):
    tx = optim.scale_by_adam(0.5, 0.75, eps=0.0, moments_dtype=dtype)
    state = tx.init({"w": jnp.zeros(1)})
    assert isinstance(state, optax.ScaleByAdamState) and state.mu["w"].dtype == dtype
    u, state = tx.update({"w": jnp.asarray([2.0])}, state)
    assert float(u["w"][0]) == pytest.approx(1.0)
    u, state = tx.update({"w": jnp.asarray([4.0])}, state)
    assert float(u["w"][0]) == pytest.approx((2.5 / 0.75) / math.sqrt(4.75 / 0.4375), rel=1e-6)
    assert int(state.count) == 2
    assert (float(state.mu["w"][0]), float(state.nu["w"][0])) == (2.5, 4.75)
