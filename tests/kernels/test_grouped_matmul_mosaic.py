"""The Mosaic GPU grouped-GEMM wrapper and the per-direction GPU choice, on CPU.

The Mosaic kernels need a Hopper GPU, so here they are replaced by stand-ins with the
shipped kernels' contract (``jax.lax.ragged_dot`` numbers, the same divisibility
assertions, and NaN in the rows the forward kernel never writes). What is tested is the
wrapper: which kernel and orientation each direction calls, the zeroing of rows past the
group total, the custom VJP, the loop under ``vmap`` and the shape checks. The kernels
themselves are checked on the GPU by ``scripts/bench/mosaic_grouped.py`` (float32
reference, poisoned outputs; docs/performance/archive/2026-11-23_third_pass_mosaic_cudnn.md).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.gemm import grouped as grouped_gemm
from fp8jax.kernels import grouped_gpu
from fp8jax.kernels import grouped_matmul_mosaic as gmm

TOL = dict(rtol=2e-2, atol=0.15)  # bf16 outputs of sums of up to 128 products


def f32(a):
  return np.asarray(a, np.float32)


CFG = gmm.Config(block_m=16, block_n=16, block_k=16, max_concurrent_steps=2, grid_block_n=1)
CONFIGS = (CFG, CFG, CFG)


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
  # imported here: Mosaic GPU's modules take a while to import, in every test process
  # pylint: disable-next=import-outside-toplevel
  from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu
  monkeypatch.setattr(ragged_dot_mgpu, "ragged_dot", _fake_ragged_dot)
  monkeypatch.setattr(transposed_ragged_dot_mgpu, "transposed_ragged_dot", _fake_transposed)


def _problem(seed=0, n=40, d=32, f=48, e=4, total=None):
  kx, kw, kd, ks = jax.random.split(jax.random.key(seed), 4)
  x = jax.random.normal(kx, (n, d), jnp.bfloat16)
  w = jax.random.normal(kw, (e, d, f), jnp.bfloat16)
  dy = jax.random.normal(kd, (n, f), jnp.bfloat16)
  cuts = np.sort(np.asarray(jax.random.randint(ks, (e - 1,), 0, total or n)))
  sizes = np.diff(np.concatenate([[0], cuts, [total or n]])).astype(np.int32)
  return x, w, dy, jnp.asarray(sizes)


@pytest.mark.slow
@pytest.mark.parametrize("total,covered", [(None, False), (None, True), (31, False)])
def test_matches_padded_grouped_matmul_with_gradients(fake_kernels, total, covered):
  x, w, dy, sizes = _problem(total=total)
  f = lambda x, w: gmm.grouped_matmul(x, w, sizes, configs=CONFIGS,  # noqa: E731
                                      covered=covered)
  ref = lambda x, w: grouped_gemm.padded_grouped_matmul(x, w, sizes)  # noqa: E731
  y, vjp = jax.vjp(f, x, w)
  y_ref, vjp_ref = jax.vjp(ref, *(a.astype(jnp.float32) for a in (x, w)))
  np.testing.assert_allclose(f32(y), y_ref, **TOL)
  if total is not None:  # rows past the total: zeros, although the kernel left NaN there
    assert np.all(f32(y)[total:] == 0)
  for got, want in zip(vjp(dy), vjp_ref(dy.astype(jnp.float32))):
    np.testing.assert_allclose(f32(got), want, **TOL)


@pytest.mark.slow
def test_vmap_loops_over_groups(fake_kernels):
  x, w, _, sizes = _problem(seed=1)
  _, _, _, sizes2 = _problem(seed=2)
  xs, ss = jnp.stack([x, x[::-1]]), jnp.stack([sizes, sizes2])
  got = jax.jit(jax.vmap(lambda a, s: gmm.grouped_matmul(a, w, s, configs=CONFIGS)))(xs, ss)
  for i in range(2):
    want = grouped_gemm.padded_grouped_matmul(xs[i].astype(jnp.float32), w.astype(jnp.float32),
                                              ss[i])
    np.testing.assert_allclose(f32(got[i]), want, **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("impls", [("mosaic", "triton", "mosaic"), ("triton", "mosaic", "triton")])
def test_grouped_gpu_composes_directions(fake_kernels, impls):
  x, w, dy, sizes = _problem(seed=3, n=24, d=128, f=128, e=3)
  impls = dict(zip(grouped_gpu.DIRECTIONS, impls))
  f = lambda x, w: grouped_gpu.grouped_matmul(x, w, sizes, impls=impls)  # noqa: E731
  ref = lambda x, w: grouped_gemm.padded_grouped_matmul(x, w, sizes)  # noqa: E731
  y, vjp = jax.vjp(f, x, w)
  y_ref, vjp_ref = jax.vjp(ref, *(a.astype(jnp.float32) for a in (x, w)))
  np.testing.assert_allclose(f32(y), y_ref, **TOL)
  for got, want in zip(vjp(dy), vjp_ref(dy.astype(jnp.float32))):
    np.testing.assert_allclose(f32(got), want, **TOL)
  with pytest.raises(ValueError, match="impls must map"):
    grouped_gpu.grouped_matmul(x, w, sizes, impls={"fwd": "cublas"})


def test_problem_names_what_the_kernel_cannot_take():
  c = gmm.FORWARD
  assert gmm.problem("fwd", (10, 1280), (63, 1280, 896), jnp.bfloat16, c) is None
  assert gmm.problem("dgrad", (10, 896), (63, 1280, 896), jnp.bfloat16, c) is None
  assert gmm.problem("wgrad", (10, 1280), (10, 896), jnp.bfloat16, c) is None
  assert "block_n" in gmm.problem("fwd", (10, 1280), (63, 1280, 864), jnp.bfloat16, c)
  assert "block_k" in gmm.problem("dgrad", (10, 864), (63, 1280, 864), jnp.bfloat16, c)
  assert "block_n" in gmm.problem("wgrad", (10, 1280), (10, 853), jnp.bfloat16, c)
  assert "dtype" in gmm.problem("fwd", (10, 1280), (63, 1280, 896), jnp.float32, c)
  with pytest.raises(ValueError, match="cannot take this shape.*864"):
    gmm.grouped_matmul(jnp.zeros((8, 1280), jnp.bfloat16),
                       jnp.zeros((2, 1280, 864), jnp.bfloat16), jnp.array([4, 4]))


def test_choose_falls_back_to_triton():
  x, w = (114688, 1280), (63, 1280, 896)
  assert grouped_gpu.choose(x, w, jnp.bfloat16, hopper=True) == grouped_gpu.PREFERRED
  assert set(grouped_gpu.choose(x, w, jnp.bfloat16, hopper=False).values()) == {"triton"}
  assert set(grouped_gpu.choose(x, (63, 1280, 864), jnp.bfloat16, hopper=True).values()) \
      == {"triton"}
  all_mosaic = dict.fromkeys(grouped_gpu.DIRECTIONS, "mosaic")
  assert grouped_gpu.choose(x, w, jnp.bfloat16, all_mosaic, hopper=True) == all_mosaic
