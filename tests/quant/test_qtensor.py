"""Quantization to a payload and its scales (``fp8jax.quant.qtensor``)."""

from hypothesis import given, settings
from hypothesis import strategies as st
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fp8jax.numerics import granularity
from fp8jax.numerics.spec import QuantSpec
from fp8jax.quant import qtensor


@pytest.mark.slow
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 70), cols=st.integers(1, 70),
       size=st.sampled_from([4, 16, 32]), fmt=st.sampled_from(["e4m3", "e5m2"]),
       pow2=st.sampled_from([None, "rceil"]), spread=st.floats(0, 30))
@settings(max_examples=25, deadline=None)  # a compilation each
def test_square_blocks_quantize_the_transpose_to_the_same_bits(seed, rows, cols, size, fmt,
                                                               pow2, spread):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((rows, cols)) * np.exp2(rng.uniform(-spread, spread, (rows, 1)))
  x = jnp.asarray(x, jnp.float32)
  spec = QuantSpec(format=fmt, granularity=granularity.block((size, size)),
                   scale_format="pow2" if pow2 else "fp32", pow2_rounding=pow2)
  q, qt = qtensor.quantize(x, spec), qtensor.quantize(x.T, spec)
  # payload bits compared through uint8 views
  np.testing.assert_array_equal(np.asarray(q.data).view(np.uint8),
                                np.asarray(qt.data).T.view(np.uint8))
  np.testing.assert_array_equal(np.asarray(q.scale_inv), np.asarray(qt.scale_inv).T)
  # and against ml_dtypes' cast of the scaled elements, for the whole tensor
  scale = np.repeat(np.repeat(np.asarray(q.scale_inv), size, 0), size, 1)[:rows, :cols]
  dtype = ml_dtypes.float8_e4m3fn if fmt == "e4m3" else ml_dtypes.float8_e5m2
  top = float(ml_dtypes.finfo(dtype).max)
  want = np.clip(np.asarray(x, np.float64) / scale, -top, top).astype(dtype)
  np.testing.assert_array_equal(np.asarray(q.data).view(np.uint8), want.view(np.uint8))
