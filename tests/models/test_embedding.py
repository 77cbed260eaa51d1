"""The token embedding lookup (``fp8jax.models.embedding``): the deterministic mode's
one-hot-GEMM gradient against a NumPy scatter-add and hand-worked sums, in every chunking
and in the table's dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.models import embedding


@pytest.mark.parametrize("chunk", [embedding.CHUNK_ELEMENTS, 7 * 16])
def test_one_hot_gradient_is_the_scatter_add(monkeypatch, chunk):
  monkeypatch.setattr(embedding, "CHUNK_ELEMENTS", chunk)  # several chunks and a padded one
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 16, (3, 25))  # repeated tokens
  g = rng.standard_normal((3, 25, 8)).astype(np.float32)
  want = np.zeros((16, 8))
  for t, row in zip(tokens.ravel(), g.reshape(-1, 8)):
    want[t] += row  # float64
  table = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)
  out, vjp = jax.vjp(lambda w: embedding.lookup(w, jnp.asarray(tokens), True), table)
  np.testing.assert_array_equal(out, jnp.take(table, tokens, axis=0))
  np.testing.assert_allclose(vjp(jnp.asarray(g))[0], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("chunk_tokens", [1, 2, 3, 10])
def test_one_hot_grad_adds_the_rows_of_a_repeated_token_and_zeros_the_unused_ones(
    monkeypatch, chunk_tokens):
  vocab = 4
  monkeypatch.setattr(embedding, "CHUNK_ELEMENTS", chunk_tokens * vocab)  # 2: a padded chunk
  tokens = jnp.asarray([2, 0, 2])
  g = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
  got = embedding.one_hot_grad(tokens, g, vocab)
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, [[3.0, 4.0], [0.0, 0.0], [6.0, 8.0], [0.0, 0.0]])


def test_both_modes_give_the_table_gradient_in_the_table_dtype():
  table = jnp.zeros((5, 3), jnp.bfloat16)
  tokens = jnp.asarray([[4, 1], [4, 4]])
  weights = jnp.arange(12, dtype=jnp.bfloat16).reshape(2, 2, 3)  # small integers: exact

  def grad(deterministic):
    return jax.grad(lambda w: jnp.sum(
        embedding.lookup(w, tokens, deterministic).astype(jnp.float32) * weights))(table)

  want = np.zeros((5, 3))
  want[1] = [3, 4, 5]
  want[4] = [0 + 6 + 9, 1 + 7 + 10, 2 + 8 + 11]
  for deterministic in (False, True):
    got = grad(deterministic)
    assert got.dtype == jnp.bfloat16, deterministic
    np.testing.assert_array_equal(np.asarray(got, np.float32), want, err_msg=str(deterministic))
