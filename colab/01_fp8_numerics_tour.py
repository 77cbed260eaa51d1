# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A tour of FP8 numerics
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fp8jax/fp8jax/blob/main/colab/01_fp8_numerics_tour.ipynb)
#
# FP8 training replaces the operands of the big matrix products by 8-bit floats with
# scales. Four choices decide how much is lost on the way:
#
# 1. the **element format** (E4M3 or E5M2): how many values, how far apart;
# 2. the **scaling granularity**: which elements share one scale, and so how far one
#    outlier reaches;
# 3. the **scale format**: any float32 scale, or a power of two that fits in one byte
#    (E8M0);
# 4. the **accumulation** of the products inside the GEMM, and how the transposed
#    operands of the backward GEMMs are produced: the tour's second part,
#    `05_fp8_gemm_numerics`.
#
# This notebook measures the first three with `fp8jax`, which simulates FP8 numerics with
# ordinary JAX arrays, on a CPU as on a GPU. Every number below is computed when the
# notebook runs. `FP8JAX_SMOKE=1` gives a small version (well under a minute on one CPU
# core; CI runs it); the full size takes a minute or two.
#
# ## Set-up
#
# In Colab this installs `fp8jax` from GitHub, keeping the runtime's JAX where it satisfies
# fp8jax's requirements; where `fp8jax` is importable already, it does nothing.

# %%
import importlib
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("fp8jax") is None:
  subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                  "fp8jax @ git+https://github.com/fp8jax/fp8jax"], check=True)
  importlib.invalidate_caches()

# %%
# %matplotlib inline

import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np

import fp8jax
from fp8jax.study import notebook
from fp8jax.study.formats import fp8_sections
from fp8jax.study.notebook import show_table

NB = notebook.start()  # versions, devices, and the size: FP8JAX_SMOKE=1 is CI's small one
SMOKE = NB.smoke

# %% [markdown]
# ## 1. The formats
#
# Both formats are 8-bit floats from `ml_dtypes`. E4M3 (`float8_e4m3fn`) spends 4 bits on
# the exponent and 3 on the fraction and has no infinity; E5M2 (`float8_e5m2`) has one more
# exponent bit and one fraction bit less, and keeps IEEE infinities.

# %%
E4M3, E5M2 = fp8jax.get_format("e4m3"), fp8jax.get_format("e5m2")


def positive_values(fmt):
  """Every finite positive value of an FP8 format, ascending, as float64."""
  v = np.arange(256, dtype=np.uint8).view(fmt.dtype).astype(np.float64)
  return np.unique(v[np.isfinite(v) & (v > 0)])


show_table([
    {"format": f.name, "dtype": np.dtype(f.dtype).name, "max": f.max,
     "min normal": f.min_normal, "min subnormal": f.min_subnormal,
     "fraction bits": f.mantissa_bits, "positive values": len(positive_values(f)),
     "binades max/min subnormal": float(np.log2(f.max / f.min_subnormal))}
    for f in (E4M3, E5M2)])

# %%
# The gap between neighbouring values (one *ulp*) grows with the magnitude; relative to the
# value it stays between `2**-m` and `2**-(m+1)` (m fraction bits) over the normal range and
# grows toward 1 among the subnormals, left of the dotted lines.
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for fmt in (E4M3, E5M2):
  v = positive_values(fmt)
  gap = np.diff(v)
  line, = axes[0].step(v[:-1], gap, where="post", label=fmt.name)
  axes[1].step(v[:-1], gap / v[:-1], where="post", label=fmt.name)
  for ax in axes:
    ax.axvline(fmt.min_normal, ls=":", color=line.get_color())
axes[0].set(xscale="log", yscale="log", xlabel="|x|", ylabel="ulp (gap to the next value)",
            title="absolute spacing")
axes[1].set(xscale="log", yscale="log", xlabel="|x|", ylabel="ulp / |x|",
            title="relative spacing")
for ax in axes:
  ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# A plain `astype` does not saturate: E4M3 turns anything that rounds above 448 into NaN,
# E5M2 turns it into inf. `fp8jax.saturating_cast` clips to the largest finite value first
# (and maps ±inf there too, like PTX `cvt.rn.satfinite`); every quantizer in fp8jax uses it.

# %%
probe = np.array([240.0, 448.0, 464.0, 465.0, 500.0, 57344.0, 61439.0, 61440.0, 1e6,
                  np.inf, np.nan], np.float32)


def plain_cast(x, fmt):
  return np.asarray(jnp.asarray(x).astype(fmt.dtype).astype(jnp.float32))


def sat_cast(x, fmt):
  return np.asarray(fp8jax.saturating_cast(jnp.asarray(x), fmt).astype(jnp.float32))


cast_rows = [{"x": float(x), "e4m3 astype": a, "e4m3 saturating": b, "e5m2 astype": c,
              "e5m2 saturating": d}
             for x, a, b, c, d in zip(probe, plain_cast(probe, E4M3), sat_cast(probe, E4M3),
                                      plain_cast(probe, E5M2), sat_cast(probe, E5M2))]
show_table(cast_rows)

# %% [markdown]
# ## 2. Tiles against outliers
#
# A quantizer maps the largest magnitude of each block (its *amax*) to the format's
# maximum: `s = fp8_max / amax`, payload `= saturating_cast(x * s)`, `scale_inv = 1 / s` per
# block. One large value shrinks every value sharing its scale toward the subnormals or
# below them (flushed to zero); the finer the blocks, the fewer values share it. A Gaussian
# tensor with one outlier, quantized with each granularity of the study (DeepSeek-V3: 1x128
# tiles for activations, 128x128 blocks for weights); the SNR is that of the ordinary values.

# %%
TOKENS, CHANNELS = (256, 512) if SMOKE else (1024, 2048)
OUTLIER = 1e5
rng = np.random.default_rng(0)
x = rng.standard_normal((TOKENS, CHANNELS)).astype(np.float32)
x[TOKENS // 3, CHANNELS // 5] = OUTLIER
bulk = np.ones(x.shape, bool)
bulk[TOKENS // 3, CHANNELS // 5] = False

tile_rows = []
for name, gran in fp8_sections.GRANULARITIES.items():
  row = {"granularity": name}
  for fmt in ("e4m3", "e5m2"):
    spec = fp8jax.QuantSpec(format=fmt, granularity=gran)
    qt = fp8jax.quantize(jnp.asarray(x), spec)
    x_hat, tel = fp8jax.quantize_dequantize(jnp.asarray(x), spec, telemetry=True)
    x_hat = np.asarray(x_hat, np.float64)
    row["scale_inv shape"] = str(tuple(qt.scale_inv.shape))
    row["block"] = "x".join(map(str, qt.full_block))
    row[f"{fmt} bulk SNR dB"] = fp8_sections.snr_db(x[bulk].astype(np.float64), x_hat[bulk])
    row[f"{fmt} flushed"] = float(tel.underflow_frac)
  tile_rows.append(row)
print(f"x: {x.shape} N(0, 1), one value = {OUTLIER:g}")
show_table(tile_rows, ["granularity", "scale_inv shape", "block", "e4m3 bulk SNR dB",
                        "e4m3 flushed", "e5m2 bulk SNR dB", "e5m2 flushed"])

# %%
# More outliers: a fraction 1e-3 of the values set to ±ratio, for growing ratios
# (`fp8_sections.quantization_snr`, behind the repository's numerics report). A 128x128
# block then usually holds several outliers, a 1x128 tile rarely more than one.
snr_sizes = fp8_sections.StudySizes(
    tokens=TOKENS, channels=CHANNELS,
    outlier_ratios=(1e1, 1e3, 1e5) if SMOKE else (1e1, 1e2, 1e3, 1e4, 1e5, 1e6))
snr_rows = fp8_sections.quantization_snr(snr_sizes)

fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
for ax, fmt in zip(axes, ("e4m3", "e5m2")):
  for name in fp8_sections.GRANULARITIES:
    rows = [r for r in snr_rows if r["format"] == fmt and r["granularity"] == name]
    ax.plot([r["outlier_ratio"] for r in rows], [r["bulk_snr_db"] for r in rows], marker="o",
            label=name)
  ax.set(xscale="log", xlabel="outlier magnitude / typical magnitude", title=fmt)
axes[0].set_ylabel("SNR of the ordinary values (dB)")
axes[1].legend()
fig.tight_layout()
plt.show()

worst = max(snr_sizes.outlier_ratios)
show_table([r for r in snr_rows if r["outlier_ratio"] == worst],
            ["format", "granularity", "bulk_snr_db", "snr_db", "underflow_frac"],
            title=f"outlier ratio {worst:g}")

# %% [markdown]
# ## 3. Scale formats: FP32 or a power of two
#
# A float32 scale maps each block's amax exactly onto the format's maximum. A power-of-two
# scale fits one byte (E8M0: exponent only) and applies exactly on every platform, but only
# reaches the nearest power of two: `floor` rounds `s` down (the amax lands between half the
# maximum and the maximum); `ceil` rounds it up (up to twice the maximum: the largest values
# saturate); `rceil` rounds `scale_inv` up (DeepGEMM's UE8M0 rule, MXFP8): like `floor`,
# except where the float32 reciprocal rounds across a power of two. The fraction of E4M3's
# range that a block's amax uses, over two binades of amax:

# %%
TILE = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.tile(128))
SCALE_RULES = {
    "fp32": TILE,
    "pow2 floor": TILE.replace(scale_format="pow2", pow2_rounding="floor"),
    "pow2 ceil": TILE.replace(scale_format="pow2", pow2_rounding="ceil"),
    "pow2 rceil": TILE.replace(scale_format="pow2", pow2_rounding="rceil"),
    "pow2 rceil, E8M0": TILE.replace(scale_format="pow2", pow2_rounding="rceil",
                                     store_e8m0=True),
}

amax = np.geomspace(1.0, 4.0, 401).astype(np.float32)
fig, ax = plt.subplots(figsize=(6, 4))
for name, spec in SCALE_RULES.items():
  if spec.store_e8m0:
    continue  # the same scales as "pow2 rceil"
  s, _ = fp8jax.compute_scale(jnp.asarray(amax), spec)
  ax.plot(amax, amax * np.asarray(s) / E4M3.max, label=name)
ax.axhline(1.0, color="grey", lw=0.8)
ax.set(xscale="log", xlabel="block amax", ylabel="amax * s / fp8_max",
       title="E4M3 range used by the block's largest value")
ax.legend()
fig.tight_layout()
plt.show()

# %%
# Rows differing in magnitude by up to four orders (1x128 tiles): SNR, fractions saturated
# and flushed, the mean fraction of the range the tiles' largest payloads use, scale bytes.
x_rows = (rng.standard_normal((TOKENS, CHANNELS))
          * 10.0 ** rng.uniform(-2, 2, (TOKENS, 1))).astype(np.float32)
scale_rows = []
dequantized = {}
for name, spec in SCALE_RULES.items():
  qt = fp8jax.quantize(jnp.asarray(x_rows), spec)
  x_hat, tel = fp8jax.quantize_dequantize(jnp.asarray(x_rows), spec, telemetry=True)
  x_hat = np.asarray(x_hat, np.float64)
  dequantized[name] = x_hat
  payload = np.abs(np.asarray(qt.data, np.float32)).reshape(TOKENS, -1, 128)
  scale_rows.append({
      "scale rule": name, "scale_inv dtype": str(qt.scale_inv.dtype),
      "bytes per scale": qt.scale_inv.dtype.itemsize,
      "SNR dB": fp8_sections.snr_db(x_rows.astype(np.float64), x_hat),
      "saturated": float(tel.saturated_frac), "flushed": float(tel.underflow_frac),
      "range used": float(np.mean(payload.max(-1)) / E4M3.max)})
show_table(scale_rows)
e8m0_lossless = np.array_equal(dequantized["pow2 rceil"], dequantized["pow2 rceil, E8M0"])
print("E8M0 storage changes no dequantized value:", e8m0_lossless)

# %%
# E8M0 stores scales that are already powers of two: `astype(float8_e8m0fnu)` of any float
# rounds to the *nearest* power of two and turns 0 into NaN; fp8jax builds its power-of-two
# scales by exponent arithmetic (`fp8jax.round_pow2`) instead.
v = np.array([0.0, 0.75, 2.9, 3.0, 5.0], np.float32)
show_table([{"v": float(a), "astype(e8m0)": float(b), "round_pow2 floor": float(c),
              "round_pow2 ceil": float(d)}
             for a, b, c, d in zip(v, v.astype(ml_dtypes.float8_e8m0fnu).astype(np.float32),
                                   np.asarray(fp8jax.round_pow2(jnp.asarray(v), "floor")),
                                   np.asarray(fp8jax.round_pow2(jnp.asarray(v), "ceil")))])

# %% [markdown]
# ## What the numbers show
#
# Each statement is checked against the numbers above, so the notebook fails instead of
# claiming something its numbers no longer show.
#
# * **Formats.** E4M3 is the finer grid (relative spacing at most `2**-3` over its normal
#   range, against `2**-2`), E5M2 the wider one (max 57344 against 448). A plain cast turns
#   overflow into NaN (E4M3) or inf (E5M2); the saturating cast never does.
# * **Tiles against outliers.** With one outlier, per-tensor scaling loses the most SNR on
#   the ordinary values and flushes some to zero, while 1x128 tiles stay close to the SNR
#   without any outlier. As outliers grow, E4M3's per-tensor SNR falls and 1x128 tiles stay
#   ahead of 128x128 blocks; E5M2's wider range absorbs them, at a lower SNR throughout.
# * **Scale formats.** Power-of-two scales (`floor`, `rceil`) use half to all of the range
#   and lose a fraction of a dB against FP32 scales; `ceil` saturates the largest values and
#   costs far more. E8M0 storage changes no value and takes one byte per scale, not four.

# %%
row = notebook.row  # the one row whose fields equal the keywords
by_name = lambda rows, key, value: {r[key]: r[value] for r in rows}
# Formats.
for fmt, bits in ((E4M3, 3), (E5M2, 2)):
  v = positive_values(fmt)
  normal = v[:-1] >= fmt.min_normal
  assert np.max(np.diff(v)[normal] / v[:-1][normal]) == 2.0**-bits
assert E4M3.max == 448 and E5M2.max == 57344
assert np.isnan(row(cast_rows, x=465.0)["e4m3 astype"])
assert np.isinf(row(cast_rows, x=61440.0)["e5m2 astype"])
assert all(np.isfinite(r["e4m3 saturating"]) and np.isfinite(r["e5m2 saturating"])
           for r in cast_rows if not np.isnan(r["x"]))
# Tiles against outliers: one outlier ...
no_outlier = rng.standard_normal(x.shape).astype(np.float32)
clean_snr = fp8_sections.snr_db(
    no_outlier.astype(np.float64),
    np.asarray(fp8jax.quantize_dequantize(jnp.asarray(no_outlier), TILE), np.float64))
one = by_name(tile_rows, "granularity", "e4m3 bulk SNR dB")
assert one["per-tensor"] == min(one.values()), one
assert row(tile_rows, granularity="per-tensor")["e4m3 flushed"] > 0
assert one["1x128"] > clean_snr - 0.5, (one, clean_snr)
# ... and many.
e4m3_per_tensor = [row(snr_rows, format="e4m3", outlier_ratio=r, granularity="per-tensor")
                   for r in snr_sizes.outlier_ratios]
assert e4m3_per_tensor[-1]["bulk_snr_db"] < e4m3_per_tensor[0]["bulk_snr_db"] - 3
for fmt in ("e4m3", "e5m2"):
  for ratio in snr_sizes.outlier_ratios[1:]:
    tiles = row(snr_rows, format=fmt, outlier_ratio=ratio, granularity="1x128")
    blocks = row(snr_rows, format=fmt, outlier_ratio=ratio, granularity="128x128")
    assert tiles["bulk_snr_db"] > blocks["bulk_snr_db"], (fmt, ratio)
e5m2_worst = [r["bulk_snr_db"] for r in snr_rows
              if r["format"] == "e5m2" and r["outlier_ratio"] == worst]
e4m3_clean = [r["bulk_snr_db"] for r in snr_rows
              if r["format"] == "e4m3" and r["outlier_ratio"] == snr_sizes.outlier_ratios[0]]
assert max(e5m2_worst) - min(e5m2_worst) < 1 and max(e5m2_worst) < min(e4m3_clean)
# Scale formats.
snr = by_name(scale_rows, "scale rule", "SNR dB")
for name in ("pow2 floor", "pow2 rceil"):
  assert 0 <= snr["fp32"] - snr[name] < 1, snr
  assert 0.5 <= row(scale_rows, **{"scale rule": name})["range used"] <= 1.0
assert row(scale_rows, **{"scale rule": "pow2 ceil"})["saturated"] > 0
assert snr["pow2 ceil"] < snr["pow2 floor"] - 3, snr
assert e8m0_lossless
assert row(scale_rows, **{"scale rule": "pow2 rceil, E8M0"})["bytes per scale"] == 1
print(f"every statement holds; the notebook ran in {NB.elapsed():.0f} s")
