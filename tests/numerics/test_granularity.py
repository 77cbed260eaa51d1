"""fp8jax.numerics.granularity: invalid granularities refused at construction, and the
block shape and block count of each kind on a given tensor shape."""

import pytest

import fp8jax


@pytest.mark.parametrize("factory,match", [
    (lambda: fp8jax.Granularity("rows", (-1,), (1,)), "unknown granularity kind"),
    (lambda: fp8jax.tile(0), "sizes must be >= 1"),
    (lambda: fp8jax.block((128, 128), (-1, -1)), "repeat an axis"),
    (lambda: fp8jax.Granularity("tile", (-1,), (None,)), "needs explicit sizes"),
    (lambda: fp8jax.Granularity("block", (-1,), (128,)), "needs 2 axes"),
    (lambda: fp8jax.Granularity("axis", (-1,), (4,)), "spans the whole axis"),
])
def test_invalid_granularities(factory, match):
  with pytest.raises(ValueError, match=match):
    factory()


def test_block_shapes():
  assert fp8jax.tile(128).block_shape((4, 300)) == (1, 128)
  assert fp8jax.tile(128).block_shape((4, 60)) == (1, 60)  # clamped, one tile
  assert fp8jax.block().block_shape((2, 256, 512)) == (1, 128, 128)
  assert fp8jax.per_axis(0).block_shape((5, 7)) == (5, 1)
  assert fp8jax.per_tensor().block_shape((5, 7)) == (5, 7)
  assert fp8jax.block().num_blocks((130, 300)) == (2, 3)
  with pytest.raises(ValueError, match="names one axis twice"):
    fp8jax.block((2, 2), (0, -2)).block_shape((4, 4))
