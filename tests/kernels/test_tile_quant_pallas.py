"""The one-pass quantization of rows for both GEMMs (``tile_quant_pallas``, interpreted).

In interpret mode on the CPU the kernel's FP8 conversion is XLA:CPU's, so these tests
check its blocking, indexing, transposition, NaN handling and scales; the bits of the
GPU's conversion and division are checked on the device by ``scripts/bench/tile_quant.py``.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.kernels import tile_quant_pallas as tq
from fp8jax.quant import qtensor
from tests import strategies as hs
from tests.references import reference as ref

# The library's quantization compiled whole, as the GEMMs run it (op by op, each of its
# operations would compile on its own for every shape: seconds per test).
_quantize = jax.jit(qtensor.quantize, static_argnums=1)


def _check(x, spec):
  q, s, qt, st = tq.quantize_rows_and_columns(jnp.asarray(x), spec, interpret=True)
  g = spec.granularity
  for data, scale_inv, operand in ((q, s, x), (qt, st.T, x.T)):
    want_data, want_scales, _ = ref.ref_quantize(np.asarray(operand), spec.format, "tile",
                                                 g.axes, g.sizes, eps=spec.eps,
                                                 margin=spec.margin)
    want = _quantize(jnp.asarray(operand), spec)
    assert ref.same_bits(np.asarray(data), np.asarray(want.data))
    assert ref.same_bits(np.asarray(scale_inv), np.asarray(want.scale_inv))
    assert ref.same_bits(np.asarray(data), want_data)  # the NumPy loops, independently
    assert ref.same_bits(np.asarray(scale_inv), want_scales)
  return q, s, qt, st


@pytest.mark.parametrize("fmt,tile,dtype", [("e4m3", 128, "bfloat16"), ("e5m2", 32, "float32"),
                                            ("e4m3", 16, "float16")])
def test_both_quantizations_equal_quantize_bit_for_bit(fmt, tile, dtype):
  """Rows and columns at different scales, NaN, ±inf, subnormals, zero rows and columns."""
  rng = np.random.default_rng(3)
  n, k = 2 * tile, 3 * tile
  x = rng.standard_normal((n, k)) * np.exp2(rng.integers(-6, 6, (n, 1)))
  x *= np.exp2(rng.integers(-4, 4, (1, k)))
  x[0, :4] = [np.nan, np.inf, -np.inf, 1e-41 if dtype == "float32" else 3.0]
  x[1, :] = 0.0
  x[:, 5] = 0.0
  x[tile + 2, tile + 1] = 6e4 if dtype == "float16" else 1e6  # one large value per block
  x = x.astype(hs.DTYPES[dtype])
  spec = fp8jax.QuantSpec(format=fmt, granularity=fp8jax.tile(tile))
  q, s, qt, st = _check(x, spec)
  assert q.shape == (n, k) and s.shape == (n, k // tile)
  assert qt.shape == (k, n) and st.shape == (n // tile, k)
  assert np.isnan(np.asarray(s)[0, 0]) and np.isnan(np.asarray(st)[0, 0])


@settings(max_examples=hs.examples(2, 12), deadline=None)
@given(st.data())
def test_drawn_inputs_and_specs(data):
  tile = data.draw(st.sampled_from([16, 32]))
  shape = (tile * data.draw(st.integers(1, 3)), tile * data.draw(st.integers(1, 3)))
  x = data.draw(hs.arrays(shape))
  spec = fp8jax.QuantSpec(format=data.draw(st.sampled_from(tq.FORMATS)),
                          granularity=fp8jax.tile(tile),
                          eps=data.draw(st.sampled_from([0.0, 1e-12, 1e-4])),
                          margin=data.draw(st.integers(-2, 3)))
  _check(x, spec)


def test_refuses_what_it_does_not_handle():
  spec = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.tile(128))
  x = jnp.zeros((256, 200), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"multiples of the tile .* got shape \(256, 200\)"):
    tq.quantize_rows_and_columns(x, spec, interpret=True)
  for other in (spec.replace(format="e2m1"), spec.replace(rounding="stochastic"),
                spec.replace(scale_format="pow2", pow2_rounding="floor"),
                spec.replace(granularity=fp8jax.tile(128, axis=0))):
    assert tq.tile_of(other) is None
    with pytest.raises(ValueError, match="1 x t tile spec"):
      tq.quantize_rows_and_columns(jnp.zeros((256, 256)), other, interpret=True)
  with pytest.raises(TypeError, match="16- or 32-bit float input"):
    tq.quantize_rows_and_columns(jnp.zeros((128, 128), jnp.float8_e4m3fn), spec,
                                 interpret=True)
  assert tq.supports((128, 256), spec) and not tq.supports((2, 128, 256), spec)
  assert jax.eval_shape(lambda v: tq.quantize_rows_and_columns(v, spec, interpret=True)[3],
                        x[:, :128]).shape == (2, 128)


def test_older_gpus_keep_the_separate_quantizations(monkeypatch):
  """Below compute capability 9.0 Triton's FP8 conversion is not round to nearest even, so
  the grouped GEMM does not take the one-pass kernel there (and the kernel refuses to run);
  FP8 dots need 8.9."""
  from fp8jax.gemm import grouped_operands
  from fp8jax.kernels import placement
  from fp8jax.kernels import scaled_matmul_pallas as smp

  cfg = fp8jax.recipe("fp32_blockwise_mma").replace(impl="pallas")
  assert grouped_operands.one_pass(cfg, 128, 256, 256, 128) and tq.rounds_exactly()
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  for cc, exact, dots in (((8, 0), False, False), ((8, 9), False, True), ((9, 0), True, True)):
    monkeypatch.setattr(placement, "compute_capability", lambda cc=cc: cc)
    assert tq.rounds_exactly() is exact
    assert grouped_operands.one_pass(cfg, 128, 256, 256, 128) is exact
    assert smp.fp8_dots_apply(jnp.float8_e4m3fn, jnp.float8_e4m3fn) is dots
    assert grouped_operands.fp8_wgrad(cfg) is dots
  monkeypatch.setattr(placement, "compute_capability", lambda: (8, 0))
  spec = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.tile(128))
  with pytest.raises(ValueError, match="compute capability 9.0"):
    tq.quantize_rows_and_columns(jnp.zeros((128, 128)), spec)
