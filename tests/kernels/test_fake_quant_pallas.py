"""The fused 1 x t fake-quant Pallas kernel (``fake_quant_pallas``), interpreted on CPU.

Its round trip against the fused XLA path and the NumPy reference bit for bit, the
hardware-cast rounding, the block shapes, lowering to Triton, the arguments it refuses and
the ``"auto"`` placement decision (``auto_applies``, ``auto_config``)."""

from __future__ import annotations

import functools
import types

from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from fp8jax.kernels import fake_quant_pallas as fqp
from fp8jax.numerics import formats, scales
from fp8jax.quant import fused_round_trip
from tests import strategies as hs
from tests.helpers import ref_for_spec
from tests.references import reference as ref

_fused_jit = jax.jit(fused_round_trip.quantize_dequantize_fused, static_argnums=1)



@pytest.mark.slow
@pytest.mark.parametrize("tiles_per_block,split", [(1, "loop"), (4, "loop"), (4, "reshape")])
@pytest.mark.parametrize("spec,dtype,shape", [
    (fp8jax.preset("deepseek_v3"), ml_dtypes.bfloat16, (24, 512)),
    (fp8jax.preset("deepseek_v3_ue8m0"), np.float32, (2, 8, 512)),
    (fp8jax.QuantSpec(format="e5m2fnuz", granularity=fp8jax.tile(32), eps=0.0),
     ml_dtypes.bfloat16, (8, 256)),
], ids=["e4m3-fp32-bf16", "e4m3-rceil-f32", "e5m2fnuz-1x32"])
def test_pallas_kernel_matches_fused_in_interpret_mode(spec, dtype, shape, tiles_per_block,
                                                       split):
  rng = np.random.default_rng(11)
  x = rng.standard_normal(shape).astype(np.float32)
  flat = x.reshape(-1, shape[-1])
  flat[0, :6] = [np.nan, np.inf, -np.inf, 3e4, 1e-30, -0.0]
  flat[1, :] = 0.0
  flat[2, 5] = 1e4
  flat[3, -3:] = [2e3, -5e-3, np.inf]  # the last tile of a row: amax differs per tile
  flat[4, : shape[-1] // 2] *= 1e-3  # tiles of one row at different scales
  x = x.astype(dtype)
  got = fqp.fake_quant_pallas(jnp.asarray(x), spec, block_rows=4,
                              tiles_per_block=tiles_per_block, split=split, interpret=True)
  assert got.dtype == x.dtype and got.shape == x.shape
  want = fused_round_trip.quantize_dequantize_fused(jnp.asarray(x), spec)
  assert ref.same_bits(np.asarray(got), np.asarray(want))
  assert ref.same_bits(np.asarray(got), ref_for_spec(x, spec)[2])


# rounding="cast" (the FP8 conversion instead of integer arithmetic). In interpret mode
# on CPU the astype to float8 is XLA:CPU's conversion, not Triton's `cvt.rn.satfinite`
# on the GPU, so these tests check the kernel's logic (clip, NaN, scales, splits) only;
# the bit-identity check of every configuration in scripts/bench/fake_quant.py, run on
# the device, is the real test of the hardware rounding.


@st.composite
def _cast_case(draw):
  t = draw(st.sampled_from([32, 128]))
  shape = draw(st.sampled_from([(8, 4 * t), (3, 2 * t), (2, 4, t)]))
  x = draw(hs.arrays(shape)).copy()
  flat = x.reshape(-1, shape[-1])
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  with np.errstate(over="ignore", invalid="ignore"):
    if draw(st.booleans()):  # outliers
      big = rng.random(flat.shape) < 0.02
      flat[big] = (flat[big].astype(np.float32) * np.float32(1e3)).astype(flat.dtype)
    if draw(st.booleans()):  # an all-zero row
      flat[rng.integers(0, flat.shape[0])] = 0
  scale_format = draw(st.sampled_from(["fp32", "pow2"]))
  spec = fp8jax.QuantSpec(
      format=draw(st.sampled_from(fqp.CAST_FORMATS)), granularity=fp8jax.tile(t),
      scale_format=scale_format,
      pow2_rounding=draw(st.sampled_from(["floor", "ceil", "rceil"]))
      if scale_format == "pow2" else None,
      eps=draw(st.sampled_from([0.0, 1e-12])), margin=draw(st.integers(-2, 1)))
  split = draw(st.sampled_from(["loop", "reshape", "flat"]))
  return x, spec, split, draw(st.sampled_from([1, 2, 4]))


@pytest.mark.slow
@settings(max_examples=min(settings().max_examples, 8))
@given(_cast_case())
def test_pallas_cast_rounding_matches_fused_in_interpret_mode(case):
  """Margins < 0 push x * s past the format's max: the clip's saturation is exercised."""
  x, spec, split, tiles = case
  xj = jnp.asarray(x)
  got = fqp.fake_quant_pallas(xj, spec, block_rows=4, tiles_per_block=tiles, split=split,
                              rounding="cast", interpret=True)
  want = _fused_jit(xj, spec)
  assert got.dtype == x.dtype and got.shape == x.shape
  assert ref.same_bits(np.asarray(got), np.asarray(want)), spec.describe()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_apply_scales_cast_saturates_like_round_to_format(fmt):
  f = formats.get_format(fmt)
  fmax, ulp = np.float32(f.max), 2.0**-f.mantissa_bits
  x = np.array([fmax * (1 + ulp / 8), fmax * (1 + ulp / 2), fmax * (1 + ulp), 2 * fmax, 3e38,
                np.inf, np.nan, f.min_subnormal / 2, f.min_subnormal * 0.75, 1e-40, 0.0,
                1.0 + ulp / 2, 1.0 + 1.5 * ulp, 3.3], np.float32)
  x = np.concatenate([x, -x])
  one = jnp.ones((), jnp.float32)
  for dtype in (jnp.float32, jnp.bfloat16):
    args = (jnp.asarray(x), one * 2, one / 2, f, dtype)
    got = jax.jit(fqp.apply_scales_cast, static_argnums=(3, 4))(*args)
    want = jax.jit(scales.apply_scales, static_argnums=(3, 4))(*args)
    assert ref.same_bits(np.asarray(got), np.asarray(want))
  got = np.asarray(fqp.apply_scales_cast(jnp.asarray(x), one, one, f, jnp.float32))
  assert np.all(np.abs(got[np.isfinite(x)]) <= fmax) and np.isnan(got[6])
  assert got[0] == fmax and got[5] == fmax and got[5 + x.size // 2] == -fmax  # ±inf -> ±max


@pytest.mark.parametrize("split", ["loop", "reshape", "flat"])
@pytest.mark.parametrize("spec", [
    fp8jax.preset("deepseek_v3"),
    fp8jax.preset("deepseek_v3_ue8m0"),
    fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.tile(128), margin=-1),
], ids=["e4m3-fp32", "e4m3-rceil", "e5m2-fp32-margin-1"])
def test_pallas_cast_rounding_edges_in_interpret_mode(spec, split):
  rng = np.random.default_rng(5)
  x = rng.standard_normal((8, 512)).astype(np.float32)
  x[0, :6] = [np.nan, np.inf, -np.inf, 3e4, 1e-30, -0.0]
  x[1, :] = 0.0
  x[2, 130] = 1e4
  x[3, :128] = 448.0  # a tile at the format's max
  x[3, 128:256] = 6e4
  x[4, 256:] = np.nan  # all-NaN tiles: amax 0, s = 1
  x = x.astype(ml_dtypes.bfloat16)
  got = fqp.fake_quant_pallas(jnp.asarray(x), spec, block_rows=4, tiles_per_block=2,
                              split=split, rounding="cast", interpret=True)
  want = _fused_jit(jnp.asarray(x), spec)
  assert ref.same_bits(np.asarray(got), np.asarray(want))
  assert ref.same_bits(np.asarray(got), ref_for_spec(x, spec)[2])


def test_pallas_cast_rounding_refuses_what_it_cannot_round(monkeypatch):
  x = jnp.ones((4, 256))
  for fmt in ("e4m3fnuz", "e5m2fnuz"):
    with pytest.raises(ValueError, match="rounding='cast' supports the formats"):
      fqp.fake_quant_pallas(x, fp8jax.QuantSpec(format=fmt, granularity=fp8jax.tile(128)),
                            rounding="cast", interpret=True)
  with pytest.raises(ValueError, match="rounding must be one of"):
    fqp.fake_quant_pallas(x, fp8jax.preset("deepseek_v3"), rounding="nearest", interpret=True)
  # Below sm_90 Triton rounds f32 -> fp8 through f16 (not RNE): refused on such a GPU.
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(jax, "devices", lambda: [types.SimpleNamespace(compute_capability="8.9")])
  with pytest.raises(ValueError, match="compute capability >= 9.0"):
    fqp.fake_quant_pallas(x, fp8jax.preset("deepseek_v3"), rounding="cast")


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize("tiles_per_block,split,rounding,fmt", [
    (1, "loop", "integer", "e4m3"), (4, "loop", "integer", "e4m3"),
    (4, "reshape", "integer", "e4m3"), (4, "loop", "cast", "e4m3"),
    (4, "reshape", "cast", "e4m3"), (1, "flat", "cast", "e4m3"), (4, "loop", "cast", "e5m2"),
])
def test_pallas_kernel_lowers_for_triton(tiles_per_block, split, rounding, fmt):
  """Lowering to the Triton custom call for an H100 (no GPU needed)."""
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None,
                                       platform="cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  spec = fp8jax.preset("deepseek_v3").replace(format=fmt)
  f = jax.jit(functools.partial(fqp.fake_quant_pallas, spec=spec, block_rows=8,
                                tiles_per_block=tiles_per_block, num_warps=4, split=split,
                                rounding=rounding))
  with jax.sharding.use_abstract_mesh(mesh):
    exported = jax.export.export(
        f, platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(jax.ShapeDtypeStruct((64, 1024), jnp.bfloat16))
  module = exported.mlir_module()
  assert "xla.gpu.triton" in module


def test_pallas_kernel_refuses_what_it_cannot_tile():
  assert fqp.supports((16, 256), fp8jax.preset("deepseek_v3"))
  assert not fqp.supports((16, 200), fp8jax.preset("deepseek_v3"))
  assert not fqp.supports((16, 256), fp8jax.preset("deepseek_v3_weight"))
  assert not fqp.supports((16, 256), fp8jax.QuantSpec(granularity=fp8jax.tile(96)))
  with pytest.raises(ValueError, match="1 x t tiles"):
    fqp.fake_quant_pallas(jnp.ones((4, 200)), fp8jax.preset("deepseek_v3"), interpret=True)
  assert fqp._rows_per_block(48, 32) == 16 and fqp._rows_per_block(7, 32) == 1
  spec = fp8jax.preset("deepseek_v3")
  assert fqp.block_shape((48, 768), spec, 32, 4) == (16, 2)
  assert fqp.block_shape((4, 2, 2048), spec, 8, 16) == (8, 16)
  assert fqp.block_shape((4, 2, 2048), spec, 8, 12) == (8, 8)
  with pytest.raises(ValueError, match="split"):
    fqp.fake_quant_pallas(jnp.ones((4, 256)), spec, split="other", interpret=True)
  assert fqp.block_shape((4, 2, 2048), spec, 64, 4, split="flat") == (64, 1)
  assert fqp.block_shape((3, 384), spec, 64, 4, split="flat") == (1, 1)


@pytest.mark.slow
@pytest.mark.parametrize("name,split", [("mxfp4", "flat"), ("mxfp6_e3m2", "loop"),
                                        ("nvfp4", "flat"), ("nvfp4", "reshape"),
                                        ("mxfp8_ocp", "loop")])
def test_pallas_kernel_mx_and_nvfp4_match_fused(name, split):
  """MX and NVFP4 in the one-pass kernel (interpreted): a tile holding NaN and inf, the
  two-level scale from the tensor amax passed in, tiles at different scales."""
  spec = fp8jax.preset(name)
  rng = np.random.default_rng(5)
  x = rng.standard_normal((16, 256)).astype(np.float32)
  x[0, :6] = [np.nan, np.inf, -np.inf, 3e4, 1e-30, -0.0]
  x[1, :] = 0.0
  x[4, :128] *= 1e-3
  x = jnp.asarray(x, jnp.bfloat16)
  assert fqp.supports(x.shape, spec)
  got = fqp.fake_quant_pallas(x, spec, block_rows=4, tiles_per_block=2, split=split,
                              **{k: v for k, v in fqp.auto_config(spec).items()
                                 if k == "rounding" and v == "integer"}, interpret=True)
  want = fused_round_trip.quantize_dequantize_fused(x, spec)
  assert ref.same_bits(np.asarray(got), np.asarray(want))
  # The tile holding NaN and inf is NaN as a whole, in every format.
  assert np.isnan(np.asarray(got, np.float32)[0]).sum() == spec.granularity.sizes[0]


def test_tile_size_is_the_length_of_current_scaled_power_of_two_row_tiles():
  spec = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.tile(64))
  assert fqp.tile_size(spec) == 64
  assert fqp.tile_size(fp8jax.preset("mxfp4")) == 32
  assert fqp.tile_size(spec.replace(granularity=fp8jax.tile(96))) is None  # not 2**n
  assert fqp.tile_size(spec.replace(granularity=fp8jax.tile(64, axis=0))) is None
  assert fqp.tile_size(spec.replace(granularity=fp8jax.per_tensor())) is None
  assert fqp.tile_size(spec.replace(rounding="stochastic")) is None


def test_integer_inputs_are_refused_with_their_dtype():
  with pytest.raises(TypeError, match="16- or 32-bit float input, got dtype int32"):
    fqp.fake_quant_pallas(jnp.ones((4, 256), jnp.int32), fp8jax.preset("deepseek_v3"),
                          interpret=True)


def test_auto_config_casts_fp8_with_one_level_scales_only():
  assert fqp.auto_config(fp8jax.preset("deepseek_v3")) == {
      "block_rows": 32, "split": "flat", "rounding": "cast", "num_warps": 4}
  assert fqp.auto_config(fp8jax.preset("mxfp8"))["rounding"] == "cast"
  for name in ("mxfp4", "mxfp6_e2m3", "nvfp4"):  # no exact cast / two-level scales
    config = fqp.auto_config(fp8jax.preset(name))
    assert config["rounding"] == "integer" and config["split"] == "flat", name


def _on_gpu(monkeypatch, cc: str):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(jax, "devices", lambda: [types.SimpleNamespace(compute_capability=cc)])


def test_auto_applies_only_on_a_hopper_or_newer_gpu(monkeypatch):
  spec = fp8jax.preset("deepseek_v3")
  assert not fqp.auto_applies((16, 256), jnp.bfloat16, spec)  # the CPU
  _on_gpu(monkeypatch, "8.9")
  assert not fqp.auto_applies((16, 256), jnp.bfloat16, spec)
  for cc in ("9.0", "10.0"):
    _on_gpu(monkeypatch, cc)
    assert fqp.auto_applies((16, 256), jnp.bfloat16, spec), cc
    assert fqp.auto_applies((2, 8, 256), jnp.float32, spec), cc


def test_auto_applies_refuses_inputs_and_specs_the_kernel_is_not_for(monkeypatch):
  _on_gpu(monkeypatch, "9.0")
  spec = fp8jax.preset("deepseek_v3")
  assert not fqp.auto_applies((16, 200), jnp.bfloat16, spec)  # 128 does not divide 200
  assert not fqp.auto_applies((16, 256), jnp.int32, spec)
  assert not fqp.auto_applies((16, 256), jnp.float8_e4m3fn, spec)
  assert not fqp.auto_applies((16, 256), jnp.bfloat16, fp8jax.preset("nvfp4"))  # two-level
  assert not fqp.auto_applies((16, 256), jnp.bfloat16, spec.replace(format="e4m3fnuz"))
  assert not fqp.auto_applies((16, 256), jnp.bfloat16, fp8jax.preset("deepseek_v3_weight"))
  assert fqp.auto_applies((16, 256), jnp.bfloat16, fp8jax.preset("mxfp4"))


def test_auto_applies_not_under_a_multi_device_mesh(monkeypatch):
  _on_gpu(monkeypatch, "9.0")
  spec = fp8jax.preset("deepseek_v3")
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((2,), ("data",))):
    assert not fqp.auto_applies((16, 256), jnp.bfloat16, spec)
  manual = jax.sharding.AbstractMesh((2,), ("data",),
                                     axis_types=(jax.sharding.AxisType.Manual,))
  with jax.sharding.use_abstract_mesh(manual):  # inside a shard_map
    assert fqp.auto_applies((16, 256), jnp.bfloat16, spec)
