"""The grouped FP8 GEMM against per-expert fp8_dot_general."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import grouped as grouped_gemm
from tests.helpers import assert_close


def _case(sizes=(128, 0, 256), k=256, f=128, seed=0):
  rng = np.random.default_rng(seed)
  n = sum(sizes)
  x = jnp.asarray(rng.standard_normal((n, k)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((len(sizes), k, f)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((n, f)) * 1e-2, jnp.float32)
  return x, w, dy, jnp.asarray(sizes, jnp.int32)


@pytest.mark.parametrize("policy", ["requant", "double", "scaling_aware"])
def test_matches_per_expert_dot_general(policy):
  """Group sizes are multiples of 128, so the Wgrad tiles align with the groups."""
  x, w, dy, sizes = _case()
  cfg = fp8jax.GemmConfig(transpose=policy)
  y, vjp = jax.vjp(lambda a, b: grouped_gemm.fp8_ragged_dot(a, b, sizes, cfg), x, w)
  dx, dw = vjp(dy)
  start = 0
  dn = (((1,), (0,)), ((), ()))
  for e, size in enumerate(np.asarray(sizes)):
    rows = slice(start, start + size)
    start += size
    if size == 0:
      np.testing.assert_array_equal(dw[e], 0)
      continue
    ye, vjp_e = jax.vjp(lambda a, b: fp8jax.fp8_dot_general(a, b, dn, config=cfg),
                        x[rows], w[e])
    dxe, dwe = vjp_e(dy[rows])
    assert_close(y[rows], ye)
    assert_close(dx[rows], dxe)
    assert_close(dw[e], dwe)


def test_bf16_mode_and_errors():
  x, w, dy, sizes = _case(sizes=(50, 70, 8), seed=1)
  y = grouped_gemm.fp8_ragged_dot(x, w, sizes, fp8jax.gemm.dense.BF16)
  ref = jax.lax.ragged_dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), sizes,
                           preferred_element_type=jnp.float32)
  assert_close(y, ref)
  g = jax.grad(lambda b: jnp.sum(grouped_gemm.fp8_ragged_dot(x, b, sizes) ** 2))(w)
  assert np.all(np.isfinite(g))
  with pytest.raises(ValueError, match="FP32 accumulation only"):
    grouped_gemm.fp8_ragged_dot(x, w, sizes, fp8jax.gemm.dense.DEEPSEEK_V3)
