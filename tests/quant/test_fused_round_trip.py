"""The fused fake-quant path, bit for bit, against the payload path
(``fp8jax.quantize_dequantize``) and the NumPy reference. ``round_to_format`` itself:
``tests/numerics/test_formats.py``; the Pallas kernel of the same round trip:
``tests/kernels/test_fake_quant_pallas.py``."""

from __future__ import annotations

from hypothesis import given
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from fp8jax.quant import fused_round_trip
from tests import strategies as hs
from tests.helpers import ref_for_spec
from tests.references import reference as ref

# --- the fused round trip ---------------------------------------------------------


_fused_jit = jax.jit(fused_round_trip.quantize_dequantize_fused, static_argnums=1)
_payload_path_jit = jax.jit(fp8jax.quantize_dequantize, static_argnums=1)


def _check_fused(x: np.ndarray, spec: fp8jax.QuantSpec, eager: bool = False):
  """Fused == payload path == NumPy reference, bit for bit (jitted; also eager)."""
  xj = jnp.asarray(x)
  fused = np.asarray(_fused_jit(xj, spec))
  old = np.asarray(_payload_path_jit(xj, spec))
  assert fused.dtype == x.dtype and fused.shape == x.shape
  assert ref.same_bits(fused, old), f"fused differs from quantize_dequantize ({spec.describe()})"
  assert ref.same_bits(fused, ref_for_spec(x, spec)[2]), "fused differs from the reference"
  if eager:
    assert ref.same_bits(np.asarray(fused_round_trip.quantize_dequantize_fused(xj, spec)), fused)


@pytest.mark.slow
@given(hs.arrays_and_specs())
def test_fused_matches_payload_path_and_reference(case):
  x, spec = case
  _check_fused(x, spec)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("spec", [
    fp8jax.preset("deepseek_v3"),
    fp8jax.preset("deepseek_v3_ue8m0"),
    fp8jax.preset("deepseek_v3_weight"),
    fp8jax.preset("mxfp8"),
    fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.per_tensor()),
    fp8jax.QuantSpec(format="e4m3fnuz", granularity=fp8jax.per_axis(0), margin=1),
    fp8jax.QuantSpec(format="e5m2fnuz", granularity=fp8jax.tile(128, 0),
                     scale_format="pow2", pow2_rounding="ceil", eps=0.0),
], ids=lambda v: v.describe() if isinstance(v, fp8jax.QuantSpec) else np.dtype(v).name)
def test_fused_with_outliers_zero_tiles_and_non_finite(spec, dtype):
  rng = np.random.default_rng(7)
  x = rng.standard_normal((64, 384)).astype(np.float32)
  x[rng.random(x.shape) < 0.01] *= 1e4  # outliers
  x[5, :] = 0.0  # all-zero tiles
  x[6, :128] = 1e-30  # tiny tiles (FP32 scale clamped at 2**126)
  x[7, 3:9] = [np.nan, np.inf, -np.inf, 1e38, -3e38, 1e-40]
  x[8, :] = np.float32(ref.FP8_MAX[spec.format])
  with np.errstate(over="ignore"):
    _check_fused(x.astype(dtype), spec)


@pytest.mark.slow
def test_fused_shapes_scalars_and_empty():
  spec = fp8jax.QuantSpec(granularity=fp8jax.per_tensor())
  _check_fused(np.array(3.3, np.float32), spec, eager=True)
  empty = fused_round_trip.quantize_dequantize_fused(jnp.zeros((0, 5)), fp8jax.QuantSpec())
  assert empty.shape == (0, 5)
  x = np.random.default_rng(3).standard_normal((2, 3, 129, 257)).astype(np.float32)
  _check_fused(x, fp8jax.QuantSpec(granularity=fp8jax.block((32, 128), (1, -1))), eager=True)


def test_fused_refuses_delayed_scaling_and_int_inputs():
  with pytest.raises(ValueError, match="current scaling"):
    fused_round_trip.quantize_dequantize_fused(jnp.ones((4,)), fp8jax.preset("te_hybrid"))
  with pytest.raises(TypeError, match="float input"):
    fused_round_trip.quantize_dequantize_fused(jnp.ones((4,), jnp.int32), fp8jax.QuantSpec())


def test_fake_quant_uses_the_fused_path_without_fp8_or_barrier():
  spec = fp8jax.preset("deepseek_v3")
  x = jnp.asarray(np.linspace(-1.7, 2.3, 512, dtype=np.float32).reshape(4, 128))
  loss = lambda v: jnp.sum(fp8jax.fake_quant(v, spec) * v)
  jaxpr = str(jax.make_jaxpr(jax.value_and_grad(loss))(x))
  assert "optimization_barrier" not in jaxpr and "float8" not in jaxpr
  hlo = jax.jit(lambda v: fp8jax.fake_quant(v, spec)).lower(x).compile().as_text()
  assert "f8e4m3" not in hlo
  y = jax.jit(lambda v: fp8jax.fake_quant(v, spec))(x)
  assert not np.array_equal(np.asarray(y), np.asarray(x)), "round trip was removed"
  np.testing.assert_array_equal(np.asarray(y), ref_for_spec(np.asarray(x), spec)[2])
  # Telemetry and delayed scaling keep the payload path.
  with_tel = str(jax.make_jaxpr(lambda v: fp8jax.fake_quant(v, spec, telemetry=True))(x))
  assert "float8" in with_tel
  hybrid = fp8jax.preset("te_hybrid")
  state = fp8jax.quant.delayed.init_state(hybrid)
  assert "float8" in str(jax.make_jaxpr(lambda v: fp8jax.fake_quant(v, hybrid, state))(x))
