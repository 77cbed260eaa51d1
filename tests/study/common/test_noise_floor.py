"""The noise floor's perturbation (fp8jax/study/common/noise_floor.py): a relative change of at
most BF16's unit roundoff per element, fixed by its key."""

import jax
import jax.numpy as jnp
import numpy as np

from fp8jax.study.common import noise_floor


def _params():
  rng = np.random.default_rng(0)
  return {"w": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32),
          "b": {"scale": jnp.asarray(1.0 + rng.random(256), jnp.float32)},
          "h": jnp.asarray(rng.normal(size=(16,)), jnp.bfloat16)}


def test_perturb_is_a_bounded_relative_change_fixed_by_its_key():
  params = _params()
  out = noise_floor.perturb(params, jax.random.key(3))
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(out)):
    assert y.dtype == x.dtype and y.shape == x.shape
    rel = np.abs(np.asarray(y, np.float64) / np.asarray(x, np.float64) - 1.0)
    assert rel.max() <= 2.0**-8 * (1 + 2.0**-7) + (2.0**-8 if x.dtype == jnp.bfloat16 else 0)
  w, w_out = np.asarray(params["w"]), np.asarray(out["w"])
  rel = w_out / w - 1.0
  assert rel.max() > 0.9 * 2.0**-8 and rel.min() < -0.9 * 2.0**-8  # spans U(-1, 1) * 2^-8
  assert abs(rel.mean()) < 2.0**-8 / 20  # centred: 2048 draws
  again = noise_floor.perturb(params, jax.random.key(3))
  other = noise_floor.perturb(params, jax.random.key(4))
  np.testing.assert_array_equal(again["w"], out["w"])
  assert not np.array_equal(other["w"], out["w"])
  big = noise_floor.perturb(params, jax.random.key(3), scale=0.5)
  assert np.abs(np.asarray(big["w"]) / w - 1.0).max() > 0.4


def test_floor_key_depends_on_step_offset_and_batch():
  def data(*args):
    return tuple(jax.random.key_data(noise_floor.floor_key(*args)).tolist())
  keys = {data(0, s, o, b) for s in (0, 1) for o in (0, 7) for b in (0, 1)}
  assert len(keys) == 8 and data(0, 1, 7, 0) == data(0, 1, 7, 0)
  assert data(1, 1, 7, 0) != data(0, 1, 7, 0)  # the seed too
