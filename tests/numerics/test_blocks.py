"""fp8jax.numerics.blocks: per-block amax, sums and broadcasts on shapes that blocks do not
divide, against loops over the blocks in NumPy."""

import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.numerics import blocks

SHAPE, BLOCK = (5, 7), (2, 3)  # 3 x 3 blocks, the last row and column of blocks partial


def _per_block(x, block, reduce):
  """``reduce`` of every (partial) block of a 2-D array, by slicing."""
  rows, cols = -(-x.shape[0] // block[0]), -(-x.shape[1] // block[1])
  return np.array([[reduce(x[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]])
                    for j in range(cols)] for i in range(rows)], np.float32)


def test_block_counts_and_alignment():
  assert blocks.num_blocks(SHAPE, BLOCK) == (3, 3)
  assert blocks.num_blocks((128, 256), (1, 128)) == (128, 2)
  assert blocks.align_block((1, 128), 4) == (1, 1, 1, 128)
  with pytest.raises(ValueError, match="more axes than the tensor"):
    blocks.align_block((1, 1, 128), 2)


def test_block_amax_and_sum_match_slices():
  x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
  np.testing.assert_array_equal(blocks.block_amax(jnp.asarray(x), BLOCK),
                                _per_block(x, BLOCK, lambda b: np.max(np.abs(b))))
  np.testing.assert_allclose(blocks.block_sum(jnp.asarray(x), BLOCK),
                             _per_block(x, BLOCK, np.sum), rtol=1e-6, atol=1e-6)


def test_non_finite_and_subnormal_values_in_the_amax():
  x = np.ones(SHAPE, np.float32)
  x[0, 0], x[4, 6] = np.nan, -np.inf  # blocks (0, 0) and (2, 2)
  x[2:4, 3:6] = 1e-40  # block (1, 1): float32 subnormals only
  amax = np.asarray(blocks.block_amax(jnp.asarray(x), BLOCK))
  assert amax[0, 0] == np.inf and amax[2, 2] == np.inf and amax[1, 1] == 0.0
  assert np.all(amax[[0, 1, 1, 2], [1, 0, 2, 1]] == 1.0)
  np.testing.assert_array_equal(blocks.finite_abs(jnp.array([-2.0, np.nan, np.inf, 1e-40])),
                                [2.0, 0.0, 0.0, 0.0])
  np.testing.assert_array_equal(blocks.amax_abs(jnp.array([-2.0, np.nan, -np.inf, 1e-40])),
                                [2.0, np.inf, np.inf, 0.0])


def test_broadcast_blocks_gives_each_element_its_block_value():
  values = jnp.arange(9.0).reshape(3, 3)
  full = np.asarray(blocks.broadcast_blocks(values, BLOCK, SHAPE))
  assert full.shape == SHAPE
  i, j = np.meshgrid(np.arange(5), np.arange(7), indexing="ij")
  np.testing.assert_array_equal(full, (i // 2) * 3 + j // 3)
