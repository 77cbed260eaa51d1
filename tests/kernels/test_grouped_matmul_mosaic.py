"""The Mosaic GPU grouped-GEMM wrapper and the per-direction GPU choice, on CPU.

The Mosaic kernels need a Hopper GPU, so here they are replaced by stand-ins with the
shipped kernels' contract (``jax.lax.ragged_dot`` numbers, the same divisibility
assertions, and NaN in the rows the forward kernel never writes). What is tested is the
wrapper: which kernel and orientation each direction calls, the zeroing of rows past the
group total, the custom VJP, the loop under ``vmap`` and the shape checks (the stand-ins:
the ``fake_kernels`` fixture of tests/kernels/conftest.py; the per-direction choice:
tests/kernels/test_grouped_gpu.py). The kernels
themselves are checked on the GPU by ``scripts/bench/mosaic_grouped.py`` (float32
reference, poisoned outputs; docs/performance/archive/2026-11-23_third_pass_mosaic_cudnn.md).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.gemm import grouped as grouped_gemm
from fp8jax.kernels import grouped_matmul_mosaic as gmm
from tests.kernels.conftest import grouped_problem

TOL = dict(rtol=2e-2, atol=0.15)  # bf16 outputs of sums of up to 128 products


def f32(a):
  return np.asarray(a, np.float32)


CFG = gmm.Config(block_m=16, block_n=16, block_k=16, max_concurrent_steps=2, grid_block_n=1)
CONFIGS = (CFG, CFG, CFG)


@pytest.mark.slow
@pytest.mark.parametrize("total,covered", [(None, False), (None, True), (31, False)])
def test_matches_padded_grouped_matmul_with_gradients(fake_kernels, total, covered):
  x, w, dy, sizes = grouped_problem(total=total)
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
  x, w, _, sizes = grouped_problem(seed=1)
  _, _, _, sizes2 = grouped_problem(seed=2)
  xs, ss = jnp.stack([x, x[::-1]]), jnp.stack([sizes, sizes2])
  got = jax.jit(jax.vmap(lambda a, s: gmm.grouped_matmul(a, w, s, configs=CONFIGS)))(xs, ss)
  for i in range(2):
    want = grouped_gemm.padded_grouped_matmul(xs[i].astype(jnp.float32), w.astype(jnp.float32),
                                              ss[i])
    np.testing.assert_allclose(f32(got[i]), want, **TOL)


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
