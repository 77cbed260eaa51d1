"""The attention core (``fp8jax.models.attention``): rotate_half RoPE against a NumPy
rotation, causal softmax attention (grouped heads included) against float64 loops, and
when cuDNN's flash attention applies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.models import attention


def _numpy_rope(x, positions, theta):
  """Pair ``(i, i + d/2)`` of each head rotated by ``position * theta ** (-2i / d)``."""
  x = np.asarray(x, np.float64)
  d = x.shape[-1]
  out = np.empty_like(x)
  for i in range(d // 2):
    angle = np.asarray(positions, np.float64) * theta ** (-2 * i / d)
    cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
    a, b = x[..., i], x[..., i + d // 2]
    out[..., i], out[..., i + d // 2] = a * cos - b * sin, b * cos + a * sin
  return out


def test_rope_turns_a_two_wide_head_by_its_position_in_radians():
  x = jnp.broadcast_to(jnp.asarray([1.0, 0.0]), (1, 4, 1, 2))  # [B, S, H, D=2]
  got = attention.rope(x, jnp.arange(4), theta=10000.0)
  p = np.arange(4.0)
  np.testing.assert_allclose(got[0, :, 0], np.stack([np.cos(p), np.sin(p)], -1), atol=1e-6)


def test_rope_rotates_the_halves_pairwise_at_falling_frequencies():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
  positions = np.array([0, 1, 2, 7, 30])
  got = attention.rope(jnp.asarray(x), jnp.asarray(positions), theta=100.0)
  np.testing.assert_allclose(got, _numpy_rope(x, positions, 100.0), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[:, 0], x[:, 0])  # position 0: unrotated


def test_the_first_query_sees_only_the_first_value_and_equal_keys_average_the_past():
  rng = np.random.default_rng(1)
  b, s, h, d = 1, 4, 2, 8
  q = rng.standard_normal((b, s, h, d)).astype(np.float32)
  k = np.broadcast_to(rng.standard_normal((b, 1, h, d)), (b, s, h, d)).astype(np.float32)
  v = rng.standard_normal((b, s, h, d)).astype(np.float32)
  got = attention.attention_core(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), "xla")
  # equal keys: equal logits, so position t weighs values 0..t alike (none after t)
  want = np.cumsum(v, axis=1) / np.arange(1, s + 1)[None, :, None, None]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[:, 0], v[:, 0], rtol=1e-6)


def test_the_output_takes_the_query_dtype():
  x = jnp.ones((1, 3, 2, 8), jnp.bfloat16)
  assert attention.attention_core(x, x, x, "xla").dtype == jnp.bfloat16
  assert attention.attention_core(x, x, x).dtype == jnp.bfloat16  # "auto" on the CPU: XLA


@pytest.mark.parametrize("backend, dtype, head, applies", [
    ("gpu", jnp.bfloat16, 64, True), ("gpu", jnp.float16, 128, True),
    ("gpu", jnp.float32, 64, False), ("gpu", jnp.bfloat16, 12, False),
    ("gpu", jnp.bfloat16, 136, False), ("cpu", jnp.bfloat16, 64, False)])
def test_cudnn_applies_on_a_gpu_to_half_precision_and_head_sizes_of_8_to_128(
    monkeypatch, backend, dtype, head, applies):
  monkeypatch.setattr(attention.jax, "default_backend", lambda: backend)
  q = jax.ShapeDtypeStruct((2, 16, 4, head), dtype)
  assert attention.cudnn_applies(q) is applies


@pytest.mark.slow
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_grouped_query_attention_core_against_numpy_loops(kv_heads):
  """attention_core's XLA path, per query head h against K/V head h // (H // K) in a
  float64 loop; its head grouping equals jax.nn.dot_product_attention's (the call the
  cuDNN path makes); its gradients equal those of multi-head attention on repeated K/V."""
  rng = np.random.default_rng(kv_heads)
  b, s, h, d = 2, 5, 4, 8
  q = rng.standard_normal((b, s, h, d)).astype(np.float32)
  k, v = (rng.standard_normal((b, s, kv_heads, d)).astype(np.float32) for _ in range(2))
  want = np.zeros((b, s, h, d))
  for bi in range(b):
    for hi in range(h):
      kh = hi // (h // kv_heads)
      for t in range(s):
        logits = [q[bi, t, hi].astype(np.float64) @ k[bi, u, kh] / np.sqrt(d)
                  for u in range(t + 1)]
        w = np.exp(np.array(logits) - max(logits))
        want[bi, t, hi] = (w / w.sum()) @ v[bi, :t + 1, kh].astype(np.float64)
  with jax.default_matmul_precision("highest"):
    got = attention.attention_core(q, k, v, "xla")
    api = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(api, want, rtol=1e-5, atol=1e-6)
    dy = rng.standard_normal(q.shape).astype(np.float32)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(attention.attention_core(*a, "xla") * dy),
                             (0, 1, 2)))
    rep = lambda x: jnp.repeat(x, h // kv_heads, axis=2)  # noqa: E731
    grads_mha = jax.jit(jax.grad(lambda a, b_, c: jnp.sum(
        attention.attention_core(a, rep(b_), rep(c), "xla") * dy), (0, 1, 2)))
    for x, y in zip(grads(q, k, v), grads_mha(q, k, v)):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
