"""fp8jax.numerics.presets: the named specs, their formats, granularities and scaling, and
an unknown name's error."""

import pytest

import fp8jax


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
