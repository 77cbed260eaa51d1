"""fp8jax's NVFP4 quantizers against Transformer Engine's own reference code, bit for bit.

``tests/references/data/te_nvfp4_reference.npz`` holds what TE's references returned on
fixed inputs (``scripts/reference/te_nvfp4_bits.py``): its PyTorch reference quantizer
``reference_nvfp4.py`` (commit d0067d0d) for plain NVFP4 (1x16, 16x16), row-scaled NVFP4
and Four Over Six, both orientations (the tensor and its transpose); the C++ CPU reference
of PR #3325 (``test_cast_nvfp4_transpose.cu``, head b47e1f88, compiled against CUDA
13.5's host ``__nv_fp8_ue5m3``) for UE5M3 block scales, plain and row-scaled, and for
E4M3. fp8jax quantizes the same inputs here; payload codes, block-scale codes and the
second level must be equal bit for bit, and the dequantized values equal TE's payload and
scales dequantized with fp8jax's convention. The documented exceptions (docs/formats.md,
"Conformance", "TE's NVFP4 references") are each asserted as exactly what they are.
"""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8jax
from fp8jax.numerics import ue5m3

DATA = pathlib.Path(__file__).resolve().parent / "data" / "te_nvfp4_reference.npz"
_NV = fp8jax.preset("nvfp4").replace(backward=None)
_W = fp8jax.preset("nvfp4_weight")
SPECS = {
    "nvfp4": _NV, "nvfp4_2d": _W, "row": _NV.replace(row_scaled=True),
    "fos_mae256": _NV.replace(four_over_six="mae"),
    "fos_mse448": _NV.replace(four_over_six="mse", four_over_six_max=448),
    "fos_mae256_2d": _W.replace(four_over_six="mae"),
    "fos_mse256_row": _NV.replace(four_over_six="mse", row_scaled=True),
    "cpp_ue5m3": _NV.replace(scale_format="ue5m3"),
    "cpp_ue5m3_row": _NV.replace(scale_format="ue5m3", row_scaled=True),
    "cpp_e4m3": _NV,
}
"""The recorded variants (the script's names) and the fp8jax spec of each."""
GRID = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
FLT_MAX = np.float32(np.finfo(np.float32).max)
SPECIAL = ("nonfinite", "signed_zero")
"""Inputs whose differences are conventions, checked by their own tests below."""


@functools.lru_cache(maxsize=1)
def recorded() -> dict:
  """The recording: ``meta`` (its sources) and every array by its key
  (``input.<case>``, ``<variant>.<case>.<row|col>.<payload|scale|amax|dequant>``)."""
  z = np.load(DATA)
  pools = {k.removeprefix("pool."): z[k] for k in z.files if k.startswith("pool.")}
  out = {"meta": json.loads(str(z["meta"]))}
  for key, (dtype, offset, shape) in json.loads(str(z["index"])).items():
    out[key] = pools[dtype][offset:offset + int(np.prod(shape))].reshape(shape)
  return out


def results(variant: str) -> list[tuple[str, str]]:
  """(case, side) pairs recorded for ``variant``."""
  return sorted({tuple(k.split(".")[1:3]) for k in recorded() if k.startswith(variant + ".")})


@functools.cache
def _quantize(variant: str):
  spec = SPECS[variant]

  @jax.jit
  def run(x):
    qt = fp8jax.quantize(x, spec)
    return qt.data, qt.scale_inv.astype(jnp.float32), qt.tensor_scale_inv, fp8jax.dequantize(
        qt, jnp.float32)
  return run


def fp8jax_bits(variant: str, x: np.ndarray):
  """fp8jax's payload codes [R, C], block-scale codes in TE's layout (one row per row of
  ``x``: 16x16 blocks repeated), second level (a scalar, or [R, 1]) and dequantized
  values [R, C] (float32)."""
  data, scale, level, deq = (np.asarray(v) for v in _quantize(variant)(jnp.asarray(x)))
  if SPECS[variant].scale_format == "ue5m3":
    codes = np.asarray(ue5m3.encode(jnp.asarray(scale)))
  else:
    codes = scale.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # exact: E4M3 values
  if SPECS[variant].granularity.kind == "block":
    codes = np.repeat(codes, 16, 0)
  return data.view(np.uint8), codes, level, deq


def te_bits(key: str):
  """TE's payload codes [R, C], block-scale codes, their values (float32, repeated to
  [R, C]) and amax (1, or one per row) of the recorded ``key``."""
  r = recorded()
  packed = r[key + ".payload"]
  codes = np.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1)
  scales = r[key + ".scale"]
  if key.startswith("cpp_ue5m3"):
    values = np.asarray(ue5m3.decode(jnp.asarray(scales)))
  else:
    values = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
  values = np.repeat(values, 16, 1)[:codes.shape[0], :codes.shape[1]]
  return codes, scales, values, r[key + ".amax"]


def te_level(amax: np.ndarray, variant: str) -> np.ndarray:
  """TE's second level ``1 / S_enc``, ``S_enc = min(6 E / amax, FLT_MAX)``, 1 where that is
  0 (amax inf) and, in the C++ reference, where amax is 0; a scalar or per row [R, 1]."""
  spec = SPECS[variant]
  e = spec.four_over_six_max if spec.four_over_six else (
      ue5m3.MAX if spec.scale_format == "ue5m3" else 448.0)
  with np.errstate(divide="ignore"):
    s_enc = np.minimum(np.float32(6.0 * e) / amax.astype(np.float32), FLT_MAX)
  one = (s_enc == 0) | ((amax == 0) & variant.startswith("cpp"))
  s_enc = np.where(one, np.float32(1.0), s_enc).astype(np.float32)
  d = (np.float32(1.0) / s_enc).astype(np.float32)
  return d.reshape(-1, 1) if spec.row_scaled else d.reshape(())


def block_amax(x: np.ndarray) -> np.ndarray:
  """Largest |x| of each 1 x 16 block of ``x`` [R, C] (zero-padded), [R, ceil(C / 16)]."""
  pad = -x.shape[1] % 16
  return np.abs(np.pad(x, [(0, 0), (0, pad)])).reshape(x.shape[0], -1, 16).max(-1)


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """|a - b| in float32 units in the last place (values of one sign)."""
  return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def compare(variant: str, case: str, side: str) -> dict[str, int]:
  """One recorded result against fp8jax; returns the counts of the documented exceptions
  it met (payload elements of zero block scales, blocks decided by flushed subnormals)."""
  spec, key = SPECS[variant], f"{variant}.{case}.{side}"
  x = recorded()[f"input.{case}"]
  x = x if side == "row" else np.ascontiguousarray(x.T)
  data, codes, level, deq = fp8jax_bits(variant, x)
  te_q, te_s, te_vals, amax = te_bits(key)
  spread = lambda b: np.repeat(b, 16, 1)[:, :x.shape[1]]  # noqa: E731
  # Four Over Six by squared error: XLA:CPU flushes float32 subnormals, torch does not, so
  # a block whose squared errors fall below 2**-126 may choose the other candidate.
  ftz = np.zeros(te_s.shape, bool)
  if spec.four_over_six == "mse":
    ftz = block_amax(x) < 2.0**-56
  codes = codes[:te_s.shape[0]]
  np.testing.assert_array_equal(codes[~ftz], te_s[~ftz], err_msg=f"{key}: block scales")
  # A zero block scale: TE's C++ reference writes payload 0 (its encode scale is 0), fp8jax
  # (as TE's PyTorch reference) multiplies by FLT_MAX and saturates; both give the same ±0.
  zero = spread(te_s == 0) & variant.startswith("cpp")
  differ = data != te_q
  assert not np.any(differ & ~zero & ~spread(ftz)), f"{key}: payload codes differ"
  assert np.all(np.signbit(GRID[data]) == np.signbit(GRID[te_q])), f"{key}: payload signs"
  counts = {"zero_scale_payloads": int(np.sum(differ & zero)),
            "ftz_blocks": int(np.sum(ftz & (block_amax(differ.astype(np.float32)) > 0)))}
  if side == "col":  # TE's dequantized values are recorded for the rowwise side
    return counts
  live = (amax > 0).reshape(-1, 1) if spec.row_scaled else np.asarray(amax[0] > 0)
  np.testing.assert_array_equal(np.where(live, level, 0),
                                np.where(live, te_level(amax, variant), 0),
                                err_msg=f"{key}: second level")
  ok = ~spread(ftz)
  mine = ((GRID[te_q] * te_vals) * level).astype(np.float32)  # fp8jax's (q * scale) * D
  np.testing.assert_array_equal(deq[ok], mine[ok], err_msg=f"{key}: dequantized values")
  kernel = recorded()[key + ".dequant"]  # (scale * amax) * (1 / 6E), then times q
  near = ok & (kernel != 0) & np.broadcast_to(live, x.shape)
  assert np.all(ulps(deq[near], kernel[near]) <= 4), f"{key}: TE's dequantized values"
  return counts


_SLOW = ("fos_mae256", "fos_mae256_2d", "fos_mse256_row", "fos_mse448", "cpp_ue5m3")
"""Variants whose first compiles take over 4 s on 2 cores (the slow tier)."""


@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.slow) if v in _SLOW
                                     else v for v in sorted(SPECS)])
def test_payloads_scales_and_levels_match_te_bit_for_bit(variant):
  counts = {"zero_scale_payloads": 0, "ftz_blocks": 0}
  for case, side in results(variant):
    if case not in SPECIAL:
      for k, v in compare(variant, case, side).items():
        counts[k] += v
  # The exceptions are met where documented, and only there.
  assert (counts["zero_scale_payloads"] > 0) == (variant in ("cpp_ue5m3", "cpp_e4m3",
                                                              "cpp_ue5m3_row")), counts
  assert (counts["ftz_blocks"] > 0) == (variant == "fos_mse256_row"), counts


def test_recording_names_its_sources():
  meta = recorded()["meta"]
  assert meta["te_commit"] == "d0067d0da6cb01811b8072a7d304f0e00344ce2b"
  assert meta["te_cpp_commit"] == "b47e1f88b71134da6853d42c57ad5810f9802e68"
  assert {k.split(".")[0] for k in recorded() if k != "meta"} == {"input", *SPECS}


@pytest.mark.parametrize("variant", ["nvfp4", "row", "cpp_ue5m3"])
def test_negative_zero_keeps_its_sign_where_te_pytorch_reference_drops_it(variant):
  """``cast_to_fp4x2`` of TE's PyTorch reference tests ``x >= 0.0`` first, so -0 gets the
  code of +0; fp8jax (as the hardware cast ``cvt.rn`` and TE's C++ reference) keeps -0."""
  for side in ("row",) if variant.startswith("cpp") else ("row", "col"):
    x = recorded()["input.signed_zero"]
    x = x if side == "row" else np.ascontiguousarray(x.T)
    data = fp8jax_bits(variant, x)[0]
    te_q = te_bits(f"{variant}.signed_zero.{side}")[0]
    negative_zero = (x == 0) & np.signbit(x)
    assert negative_zero.sum() > 0
    if variant.startswith("cpp"):
      np.testing.assert_array_equal(data, te_q)
    else:
      np.testing.assert_array_equal(data != te_q, negative_zero)
      assert np.all(data[negative_zero] == 8) and np.all(te_q[negative_zero] == 0)


def _nonfinite_rows(x: np.ndarray) -> np.ndarray:
  return ~np.all(np.isfinite(x), axis=1)


@pytest.mark.parametrize("variant", ["nvfp4", "nvfp4_2d", "row"])
def test_nan_and_inf_mark_their_block_where_te_spreads_them(variant):
  """TE's reference takes ``torch.max`` over the tensor (row): a NaN makes every block scale
  of the tensor (row) NaN, an inf makes ``S_enc`` 1 and rescales it. fp8jax marks the
  blocks holding NaN or inf (NaN scale, the rest untouched), so the rows free of them are
  equal bit for bit where TE's level is per row."""
  for side in ("row", "col"):
    x = recorded()["input.nonfinite"]
    x = x if side == "row" else np.ascontiguousarray(x.T)
    data, codes, _, _ = fp8jax_bits(variant, x)
    te_q, te_s, _, amax = te_bits(f"{variant}.nonfinite.{side}")
    bad = block_amax(np.where(np.isfinite(x), 0.0, 1.0)) > 0
    if SPECS[variant].granularity.kind == "block":
      bad = np.repeat(bad.reshape(-1, 16, bad.shape[1]).any(1), 16, 0)
    np.testing.assert_array_equal((codes & 0x7F) == 0x7F, bad)
    if variant == "row":
      rows = _nonfinite_rows(x)
      assert np.all(np.isnan(amax[rows])) or np.all(np.isinf(amax[rows]) | np.isnan(amax[rows]))
      np.testing.assert_array_equal(data[~rows], te_q[~rows])
      np.testing.assert_array_equal(codes[~rows], te_s[~rows])
    else:
      assert np.isnan(amax).all() and np.all((te_s & 0x7F) == 0x7F)


def test_an_all_zero_tensor_or_row_gets_level_one_where_te_takes_one_over_flt_max():
  """TE's PyTorch reference: ``S_enc = min(2688 / 0, FLT_MAX)`` = FLT_MAX, its reciprocal
  a float32 subnormal; its C++ reference and fp8jax take ``S_enc`` = 1. Payloads and
  block scales are zero either way."""
  for variant, case in (("nvfp4", "all_zero"), ("row", "zero_blocks"),
                        ("cpp_ue5m3", "all_zero")):
    x = recorded()[f"input.{case}"]
    data, codes, level, _ = fp8jax_bits(variant, x)
    te_q, te_s, _, amax = te_bits(f"{variant}.{case}.row")
    zero_rows = np.all(x == 0, axis=1)
    level = np.broadcast_to(level, (x.shape[0], 1))[zero_rows]
    te = np.broadcast_to(te_level(amax, variant), (x.shape[0], 1))[zero_rows]
    assert np.all(level == 1)
    assert np.all(te == (1 if variant.startswith("cpp") else np.float32(1) / FLT_MAX))
    np.testing.assert_array_equal(data[zero_rows], te_q[zero_rows])
    np.testing.assert_array_equal(codes[zero_rows], te_s[zero_rows])
