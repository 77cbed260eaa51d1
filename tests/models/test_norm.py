"""RMSNorm (``fp8jax.models.norm``): hand-worked values, the epsilon, a float32 variance
for half-precision inputs, and the cast to the input's dtype before the weight multiplies."""

import types

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from fp8jax.models.norm import RMSNorm


def _norm(d, eps=0.0, param_dtype="float32", weight=None):
  norm = RMSNorm(types.SimpleNamespace(hidden_size=d, rms_norm_eps=eps,
                                       param_dtype=param_dtype))
  if weight is not None:
    norm.weight[...] = jnp.asarray(weight, norm.weight[...].dtype)
  return norm


def test_each_row_is_divided_by_its_root_mean_square_then_scaled_by_the_weight():
  norm = _norm(4, weight=[1.0, 2.0, 0.5, -1.0])
  x = jnp.asarray([[3.0, -3.0, 3.0, -3.0],   # rms 3
                   [1.0, 2.0, 2.0, 4.0]])    # rms sqrt(25 / 4) = 2.5
  np.testing.assert_allclose(norm(x), [[1.0, -2.0, 0.5, 1.0], [0.4, 1.6, 0.4, -1.6]],
                             rtol=1e-6)


def test_the_weight_starts_at_ones_in_the_param_dtype():
  norm = _norm(3, param_dtype="bfloat16")
  assert norm.weight[...].dtype == jnp.bfloat16
  np.testing.assert_array_equal(norm.weight[...], np.ones(3))


def test_epsilon_is_added_to_the_mean_square_and_keeps_a_zero_row_finite():
  norm = _norm(4, eps=1e-6)
  x = jnp.asarray([[1e-3] * 4, [0.0] * 4])
  # 1e-3 / sqrt(1e-6 + 1e-6)
  np.testing.assert_allclose(norm(x), [[2 ** -0.5] * 4, [0.0] * 4], rtol=1e-5)


def test_a_float16_input_has_its_variance_in_float32():
  # 300^2 and 400^2 overflow float16 (max 65504); in float32 the mean square is 125000
  x = jnp.asarray([300.0, -400.0], jnp.float16)
  got = _norm(2)(x)
  assert got.dtype == jnp.float16
  np.testing.assert_allclose(np.asarray(got, np.float32),
                             [300 / 125000 ** 0.5, -400 / 125000 ** 0.5], rtol=1e-3)


def test_a_bfloat16_input_is_normalized_rounded_then_scaled_in_bfloat16():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((4, 64)).astype(ml_dtypes.bfloat16)
  w = rng.uniform(0.5, 1.5, 64).astype(np.float32)
  got = _norm(64, eps=1e-6, weight=w)(jnp.asarray(x))
  assert got.dtype == jnp.bfloat16
  x32 = x.astype(np.float32)
  y = (x32 / np.sqrt(np.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(np.float32)
  bf16 = lambda a: np.asarray(a, np.float32).astype(ml_dtypes.bfloat16)  # noqa: E731
  want = bf16(bf16(y).astype(np.float32) * bf16(w).astype(np.float32))
  # one rounding (weight times the float32 value) gives other bits: the test tells them apart
  assert not np.array_equal(want, bf16(y * bf16(w).astype(np.float32)))
  np.testing.assert_array_equal(np.asarray(got, np.float32), want.astype(np.float32))
