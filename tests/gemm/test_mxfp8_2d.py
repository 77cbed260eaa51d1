"""The ``mxfp8_2d`` recipe's weights: 32 x 32 blocks with MXFP8's round-up E8M0 scale, the
same for the weight and its transpose (Transformer Engine's ``enable_2d_quantization``), so
Fprop and Dgrad read one quantized weight."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax


@pytest.mark.slow
def test_weight_blocks_share_one_scale_both_ways():
  cfg = fp8jax.recipe("mxfp8_2d")
  spec = cfg.roles.weight
  assert cfg.roles.input == fp8jax.recipe("mxfp8").roles.input
  w = np.array(jax.random.normal(jax.random.key(0), (64, 96)), np.float32)
  w[0:32, 32:64] *= 1e3
  qt = fp8jax.quantize(jnp.asarray(w), spec)
  inv = np.asarray(qt.scale_inv, np.float32).reshape(2, 3)
  for i in range(2):
    for j in range(3):
      amax = np.abs(w[32 * i:32 * (i + 1), 32 * j:32 * (j + 1)]).max()
      assert inv[i, j] == 2.0 ** math.ceil(math.log2(amax / 448.0))
  qt_t = fp8jax.quantize(jnp.asarray(w.T), spec)
  np.testing.assert_array_equal(np.asarray(qt_t.scale_inv, np.float32).reshape(3, 2), inv.T)
  a = np.asarray(fp8jax.dequantize(qt, jnp.float32))
  b = np.asarray(fp8jax.dequantize(qt_t, jnp.float32))
  np.testing.assert_array_equal(a.T.view(np.uint32), b.view(np.uint32))
