"""QuantSpec validation and hashing (granularities: ``tests/numerics/test_granularity.py``;
presets: ``tests/numerics/test_presets.py``)."""

import jax
import jax.numpy as jnp
import pytest

import fp8jax
from fp8jax import QuantSpec


@pytest.mark.parametrize("kwargs,match", [
    (dict(format="e4m4"), "unknown FP8 format"),
    (dict(scaling="lazy"), "unknown scaling"),
    (dict(scaling="delayed"), "delayed scaling is per-tensor only"),
    (dict(scale_format="fp16"), "unknown scale_format"),
    (dict(scale_format="pow2", pow2_rounding="nearest"), "unknown pow2_rounding"),
    (dict(store_e8m0=True), "store_e8m0=True needs scale_format='pow2'"),
    (dict(eps=-1.0), "eps must be a finite number >= 0"),
    (dict(eps=float("nan")), "eps must be a finite number >= 0"),
    (dict(margin=0.5), "margin must be an integer"),
    (dict(margin=100), "margin must be an integer in"),
    (dict(scaling="delayed", granularity=fp8jax.per_tensor(), history_len=0),
     "history_len must be a positive integer"),
    (dict(backward=QuantSpec(backward=QuantSpec())), "cannot have a backward spec"),
    (dict(pow2_rounding="rceil"), "needs scale_format='pow2'"),
    (dict(history_len=16), "apply to delayed scaling only"),
    (dict(margin=None), "margin must be an integer"),
])
def test_invalid_specs_fail_at_construction(kwargs, match):
  with pytest.raises(ValueError, match=match):
    QuantSpec(**kwargs)


def test_type_errors_name_the_field():
  with pytest.raises(TypeError, match="granularity must be"):
    QuantSpec(granularity="1x128")
  with pytest.raises(TypeError, match="backward must be"):
    QuantSpec(backward="ste")
  with pytest.raises(TypeError, match="store_e8m0 must be a bool"):
    QuantSpec(scale_format="pow2", store_e8m0="no")
  with pytest.raises(TypeError, match="size must be an integer, got 128.7"):
    fp8jax.tile(128.7)
  with pytest.raises(TypeError, match="axis must be an integer"):
    fp8jax.tile(32, axis=1.5)
  assert QuantSpec(scale_format="pow2").pow2_rounding == "floor"


def test_specs_are_hashable_static_jit_arguments():
  a = QuantSpec(granularity=fp8jax.tile(128), backward=QuantSpec(format="e5m2"))
  b = QuantSpec(granularity=fp8jax.tile(128), backward=QuantSpec(format="float8_e5m2"))
  assert a == b and hash(a) == hash(b)
  assert len({a, b, QuantSpec()}) == 2
  f = jax.jit(fp8jax.fake_quant, static_argnums=1)
  assert f(jnp.ones((2, 128)), a).shape == (2, 128)
