"""The token embedding lookup, with a deterministic gradient on request.

``lookup(table, tokens)`` is ``jnp.take(table, tokens, axis=0)`` (what ``nnx.Embed``
computes). Its gradient with respect to the table is a scatter-add of the output's
cotangent rows into the rows of their tokens; on a GPU, XLA's scatter-add accumulates
with atomics, so a token that occurs several times in a batch gets its row's sum in
whatever order the threads arrive, and two runs differ in the last bits (the one source
of run-to-run differences of the model's BF16 gradient on an H100, docs/determinism.md).

With ``deterministic=True`` the backward pass is instead the product
``one_hot(tokens)^T @ g`` (float32 accumulation; cuBLAS GEMMs give the same bits on every
run), over chunks of at most :data:`CHUNK_ELEMENTS` one-hot elements added in a fixed
order. It equals the scatter-add up to float32 rounding and costs ``2 T V d`` FLOPs (at
the 2B widths and 8 x 2048 tokens, 0.34 TFLOP, small beside the step's; the mode's cost:
docs/performance/archive/2026-11-25_deterministic_mode.md).
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

CHUNK_ELEMENTS = 1 << 28
"""The largest one-hot block [tokens, vocabulary] the deterministic backward builds."""


def lookup(table: jax.Array, tokens: jax.Array, deterministic: bool = False) -> jax.Array:
  """Rows of ``table`` [V, d] for int ``tokens`` [...] -> [..., d]; ``deterministic``: the
  table's gradient as a one-hot GEMM instead of a scatter-add (module docstring)."""
  if not deterministic:
    return jnp.take(table, tokens, axis=0)
  return _lookup(table, tokens)


@jax.custom_vjp
def _lookup(table, tokens):
  return jnp.take(table, tokens, axis=0)


def _lookup_fwd(table, tokens):
  return jnp.take(table, tokens, axis=0), (tokens, jnp.zeros((0,), table.dtype),
                                           table.shape[0])


def _lookup_bwd(res, g):
  tokens, like, vocab = res
  return one_hot_grad(tokens.reshape(-1), g.reshape(-1, g.shape[-1]), vocab).astype(
      like.dtype), None


def one_hot_grad(tokens: jax.Array, g: jax.Array, vocab: int) -> jax.Array:
  """``sum_t e_{tokens[t]} g[t]^T``: float32 [vocab, d] from tokens [T] and g [T, d]."""
  t, d = g.shape
  chunk = max(1, min(t, CHUNK_ELEMENTS // max(vocab, 1)))
  n = -(-t // chunk)
  pad = n * chunk - t
  tok = jnp.pad(tokens, (0, pad), constant_values=-1).reshape(n, chunk)  # -1: a zero row
  rows = jnp.pad(g, ((0, pad), (0, 0))).reshape(n, chunk, d)
  product = functools.partial(jnp.einsum, "tv,td->vd", preferred_element_type=jnp.float32)

  def step(acc, xs):
    ids, gs = xs
    return acc + product(jax.nn.one_hot(ids, vocab, dtype=gs.dtype), gs), None

  acc, _ = lax.scan(step, jnp.zeros((vocab, d), jnp.float32), (tok, rows))
  return acc


_lookup.defvjp(_lookup_fwd, _lookup_bwd)
