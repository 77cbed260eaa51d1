"""fp8jax.gemm.grouped_padded: the tiled grouped GEMM with static shapes equals
``jax.lax.ragged_dot``, values and gradients, with empty groups and rows past the groups."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [(5, 0, 130, 1), (0, 0, 0, 9), (128, 128, 0, 0),
                                   (2, 0, 1, 0)])
def test_tiled_grouped_matmul_equals_ragged_dot(sizes):
  from fp8jax.gemm.grouped import padded_grouped_matmul

  rng = np.random.default_rng(7)
  n = max(sum(sizes), 6)  # rows past the groups' sum must come out as zeros
  x = jnp.asarray(rng.standard_normal((n, 16)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((4, 16, 8)), jnp.float32)
  group_sizes = jnp.asarray(sizes, jnp.int32)
  with jax.default_matmul_precision("highest"):
    got, vjp = jax.vjp(lambda a, b: padded_grouped_matmul(a, b, group_sizes, tile=8), x, w)
    want, vjp_ref = jax.vjp(lambda a, b: jax.lax.ragged_dot(a, b, group_sizes), x, w)
    dy = jnp.asarray(rng.standard_normal(got.shape), jnp.float32)
    for a, b in zip((got, *vjp(dy)), (want, *vjp_ref(dy))):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
