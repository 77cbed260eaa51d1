"""Fixtures of the kernel tests: stand-ins for the Mosaic GPU grouped-GEMM kernels that JAX
ships (they need a Hopper GPU), and a grouped-GEMM problem, for the tests of
``grouped_matmul_mosaic`` and ``grouped_gpu``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def grouped_problem(seed=0, n=40, d=32, f=48, e=4, total=None):
  """BF16 x [n, d], w [e, d, f], dy [n, f] and int32 group sizes [e] summing to ``total``
  (default ``n``; fewer rows than ``n`` leave padding rows at the end)."""
  kx, kw, kd, ks = jax.random.split(jax.random.key(seed), 4)
  x = jax.random.normal(kx, (n, d), jnp.bfloat16)
  w = jax.random.normal(kw, (e, d, f), jnp.bfloat16)
  dy = jax.random.normal(kd, (n, f), jnp.bfloat16)
  cuts = np.sort(np.asarray(jax.random.randint(ks, (e - 1,), 0, total or n)))
  sizes = np.diff(np.concatenate([[0], cuts, [total or n]])).astype(np.int32)
  return x, w, dy, jnp.asarray(sizes)


def _fake_ragged_dot(lhs, rhs, *, group_sizes, block_m, block_n, block_k,
                     max_concurrent_steps, grid_block_n, transpose_rhs=False):
  del block_m, max_concurrent_steps, grid_block_n
  w = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
  assert lhs.shape[1] % block_k == 0 and w.shape[2] % block_n == 0
  y = jax.lax.ragged_dot(lhs.astype(jnp.float32), w.astype(jnp.float32), group_sizes)
  rows = jnp.arange(lhs.shape[0])[:, None]
  return jnp.where(rows < jnp.sum(group_sizes), y, jnp.nan).astype(lhs.dtype)


def _fake_transposed(lhs, rhs, *, group_sizes, block_m, block_n, block_k,
                     max_concurrent_steps, grid_block_n):
  del block_k, max_concurrent_steps, grid_block_n
  assert lhs.shape[1] % block_m == 0 and rhs.shape[1] % block_n == 0
  ends = jnp.cumsum(group_sizes)
  rows = jnp.arange(lhs.shape[0])
  member = (rows[None, :] >= (ends - group_sizes)[:, None]) & (rows[None, :] < ends[:, None])
  out = jnp.einsum("gk,km,kn->gmn", member.astype(jnp.float32), lhs.astype(jnp.float32),
                   rhs.astype(jnp.float32))
  return out.astype(lhs.dtype)


@pytest.fixture
def fake_kernels(monkeypatch):
  """The shipped kernels replaced by stand-ins with their contract: ``jax.lax.ragged_dot``
  numbers, the same divisibility assertions, and NaN in the rows the forward kernel never
  writes."""
  # imported here: Mosaic GPU's modules take a while to import, in every test process
  # pylint: disable-next=import-outside-toplevel
  from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu
  monkeypatch.setattr(ragged_dot_mgpu, "ragged_dot", _fake_ragged_dot)
  monkeypatch.setattr(transposed_ragged_dot_mgpu, "transposed_ragged_dot", _fake_transposed)
