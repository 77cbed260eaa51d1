"""QuantSpec / Granularity validation, hashing and presets."""

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


def test_specs_are_hashable_static_jit_arguments():
  a = QuantSpec(granularity=fp8jax.tile(128), backward=QuantSpec(format="e5m2"))
  b = QuantSpec(granularity=fp8jax.tile(128), backward=QuantSpec(format="float8_e5m2"))
  assert a == b and hash(a) == hash(b)
  assert len({a, b, QuantSpec()}) == 2
  f = jax.jit(fp8jax.fake_quant, static_argnums=1)
  assert f(jnp.ones((2, 128)), a).shape == (2, 128)


def test_presets():
  assert set(fp8jax.numerics.presets.PRESETS) >= {"deepseek_v3", "deepseek_v3_weight", "te_hybrid",
                                 "current_tensor", "mxfp8"}
  ds = fp8jax.preset("deepseek_v3")
  assert (ds.format, ds.granularity, ds.scaling) == ("e4m3", fp8jax.tile(128), "current")
  assert ds.backward.format == "e4m3" and ds.backward.granularity == fp8jax.tile(128)
  assert fp8jax.preset("deepseek_v3_weight").granularity == fp8jax.block((128, 128))
  te = fp8jax.preset("te_hybrid")
  assert (te.scaling, te.backward.format, te.backward.scaling) == ("delayed", "e5m2",
                                                                   "delayed")
  mx = fp8jax.preset("mxfp8")
  assert mx.granularity == fp8jax.tile(32) and mx.store_e8m0
  with pytest.raises(ValueError, match="unknown preset 'deepseek'.*known presets"):
    fp8jax.preset("deepseek")
  for spec in fp8jax.numerics.presets.PRESETS.values():
    assert isinstance(spec.describe(), str)
