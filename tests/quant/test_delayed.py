"""Delayed scaling: step-by-step against a NumPy re-implementation, and the
overwrite-with-gradient channel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.quant import delayed
from tests.references import reference as ref


def _steps(rng, n):
  """Per-step tensors whose range jumps (240 -> 480 -> small)."""
  peaks = [240.0, 480.0, 100.0, 3.0, 50.0, 700.0][:n]
  out = []
  for p in peaks:
    x = rng.uniform(-1, 1, (4, 64)).astype(np.float32)
    x[0, 0] = p
    out.append(x)
  return out


@pytest.mark.parametrize("reduce", ["max", "most_recent"])
def test_delayed_steps_and_rollover_match_numpy(reduce):
  spec = fp8jax.QuantSpec(granularity=fp8jax.per_tensor(), scaling="delayed",
                          history_len=3, history_reduce=reduce)
  history = delayed.init_history(spec)
  np_hist = [0.0, 0.0, 0.0]
  step = jax.jit(fp8jax.quantize_and_update, static_argnums=1)
  for t, x in enumerate(_steps(np.random.default_rng(0), 6)):
    chosen = max(np_hist) if reduce == "max" else np_hist[0]
    if chosen == 0:  # first step: the tensor's own amax
      chosen = float(np.max(np.abs(x)))
    payload, scale_inv, _ = ref.ref_quantize(x, "e4m3", "tensor", (), (), amax=chosen)
    qt, history = step(jnp.asarray(x), spec, history)
    assert ref.same_bits(np.asarray(qt.data), payload), f"step {t}"
    assert ref.same_bits(np.asarray(qt.scale_inv), scale_inv), f"step {t}"
    np_hist = [float(np.max(np.abs(x)))] + np_hist[:-1]  # newest first, oldest drops
    np.testing.assert_array_equal(history, np.array(np_hist, np.float32))


def test_range_jump_saturates_under_delayed_but_not_current_scaling():
  spec = fp8jax.QuantSpec(granularity=fp8jax.per_tensor(), scaling="delayed",
                          history_len=4)
  small, big = _steps(np.random.default_rng(1), 2)
  _, history = fp8jax.quantize_and_update(jnp.asarray(small), spec, delayed.init_history(spec))
  qt, _ = fp8jax.quantize_and_update(jnp.asarray(big), spec, history)
  out = np.asarray(fp8jax.dequantize(qt))
  assert out[0, 0] == pytest.approx(240.0, rel=0.07)  # 480 clipped at the old scale
  current = fp8jax.quantize_dequantize(jnp.asarray(big), fp8jax.preset("current_tensor"))
  assert float(current[0, 0]) == pytest.approx(480.0, rel=0.07)


def _te_loss(x, fp8_state, combine):
  spec = fp8jax.preset("te_hybrid")
  st = delayed.max_combined(fp8_state) if combine else fp8_state
  return jnp.sum(fp8jax.fake_quant(x, spec, st) * jnp.arange(x.size).reshape(x.shape))


def test_state_gradient_is_the_updated_state():
  spec = fp8jax.preset("te_hybrid")
  state = delayed.init_state(spec)
  x = jnp.asarray(_steps(np.random.default_rng(2), 1)[0])
  _, new_state = jax.jit(jax.grad(_te_loss, argnums=(0, 1)), static_argnums=2)(
      x, state, True)
  upstream = np.arange(x.size, dtype=np.float32).reshape(x.shape)
  assert float(new_state.fwd[0]) == 240.0 and np.all(new_state.fwd[1:] == 0)
  assert float(new_state.bwd[0]) == upstream.max()  # the cotangent's amax
  # Second step: the cotangent is quantized with the recorded E5M2 scale.
  dx, newer = jax.grad(_te_loss, argnums=(0, 1))(x * 2, new_state, True)
  _, _, expected_dx = ref.ref_quantize(upstream, "e5m2", "tensor", (), (),
                                       amax=float(new_state.bwd[0]))
  np.testing.assert_array_equal(dx, expected_dx)
  np.testing.assert_array_equal(newer.fwd[:2], [480.0, 240.0])


def test_repeated_uses_max_combine_only_with_max_combined():
  spec = fp8jax.QuantSpec(granularity=fp8jax.per_tensor(), scaling="delayed",
                          history_len=2)
  a = jnp.array([1.0, -7.0])
  b = jnp.array([5.0, 2.0])

  def loss(state, combine):
    st = delayed.max_combined(state) if combine else state
    return jnp.sum(fp8jax.fake_quant(a, spec, st)) + jnp.sum(fp8jax.fake_quant(b, spec, st))

  state = delayed.DelayedState(fwd=jnp.array([3.0, 0.0]))
  combined = jax.jit(jax.grad(loss), static_argnums=1)(state, True)
  np.testing.assert_array_equal(combined.fwd, [7.0, 3.0])
  summed = jax.grad(loss)(state, False)  # the failure max_combined exists to prevent
  np.testing.assert_array_equal(summed.fwd, [12.0, 6.0])


def test_missing_or_mismatched_state_is_a_clear_error():
  spec = fp8jax.preset("te_hybrid")
  x = jnp.ones((4,))
  with pytest.raises(ValueError, match="needs an amax history"):
    fp8jax.fake_quant(x, spec, fp8jax.DelayedState())
  with pytest.raises(ValueError, match="history has shape \\(8,\\).*history_len=1024"):
    fp8jax.fake_quant(x, spec, fp8jax.DelayedState(jnp.zeros(8), jnp.zeros(1024)))
  with pytest.raises(ValueError, match="needs an amax history"):
    fp8jax.quantize(x, spec)
