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
#    operands of the backward GEMMs are produced.
#
# This notebook measures each of them with `fp8jax`, a JAX library that simulates FP8
# numerics with ordinary JAX arrays (including a bit-exact model of Hopper tensor-core
# accumulation), so it runs on a CPU as well as on a GPU. Every number below is computed
# when the notebook runs.
#
# Set the environment variable `FP8JAX_SMOKE=1` for a small version that runs in well under
# a minute on one CPU core (CI runs it that way); the full size takes a minute or two, on a
# CPU as on a GPU (compiling the many small programs dominates).

# %% [markdown]
# ## Set-up
#
# In Colab this installs `fp8jax` from GitHub. It pins no JAX version of its own: pip keeps
# the runtime's JAX when it satisfies fp8jax's requirements. Where `fp8jax` is already
# importable (a local checkout installed with `pip install -e .`), the cell does nothing.

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
import functools
import os
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np

import fp8jax
from fp8jax.gemm import accumulate
from fp8jax.study.numerics import fp8_study

SMOKE = os.environ.get("FP8JAX_SMOKE", "0") == "1"
START = time.time()
print(f"jax {jax.__version__}, fp8jax {fp8jax.__version__}, backend {jax.default_backend()}")
print("devices:", jax.devices())
print("smoke size" if SMOKE else "full size")


def print_table(rows, columns=None, title=None):
  """Prints a list of dicts as an aligned text table (floats to 5 significant digits)."""
  columns = columns or list(rows[0])

  def fmt(v):
    if isinstance(v, float | np.floating):
      return f"{v:.5g}"
    return str(v)

  cells = [[fmt(r[c]) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
  if title:
    print(title)
  print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
  print("  ".join("-" * w for w in widths))
  for row in cells:
    print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
  print()


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


print_table([
    {"format": f.name, "dtype": np.dtype(f.dtype).name, "max": f.max,
     "min normal": f.min_normal, "min subnormal": f.min_subnormal,
     "fraction bits": f.mantissa_bits, "positive values": len(positive_values(f)),
     "binades max/min subnormal": float(np.log2(f.max / f.min_subnormal))}
    for f in (E4M3, E5M2)])

# %% [markdown]
# The gap between neighbouring values (one *ulp*) grows with the magnitude. Relative to the
# value it stays between `2**-m` and `2**-(m+1)` (m fraction bits) over the normal range and
# grows toward 1 among the subnormals, left of the dotted lines.

# %%
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
print_table(cast_rows)

# %% [markdown]
# ## 2. Tiles against outliers
#
# A quantizer maps the largest magnitude of each block (its *amax*) to the format's
# maximum: `s = fp8_max / amax`, payload `= saturating_cast(x * s)`, and it keeps
# `scale_inv = 1 / s` per block. One large value therefore shrinks every value that shares
# its scale toward the subnormals, or below the smallest subnormal, where it is flushed to
# zero. The finer the blocks, the fewer values share the outlier's scale.
#
# A Gaussian activation tensor with a single outlier, quantized with each granularity of the
# study (the DeepSeek-V3 recipe uses 1x128 tiles for activations and 128x128 blocks for
# weights). `scale_inv` has one entry per block; the SNR is measured on the ordinary
# values only.

# %%
TOKENS, CHANNELS = (256, 512) if SMOKE else (1024, 2048)
OUTLIER = 1e5
rng = np.random.default_rng(0)
x = rng.standard_normal((TOKENS, CHANNELS)).astype(np.float32)
x[TOKENS // 3, CHANNELS // 5] = OUTLIER
bulk = np.ones(x.shape, bool)
bulk[TOKENS // 3, CHANNELS // 5] = False

tile_rows = []
for name, gran in fp8_study.GRANULARITIES.items():
  row = {"granularity": name}
  for fmt in ("e4m3", "e5m2"):
    spec = fp8jax.QuantSpec(format=fmt, granularity=gran)
    qt = fp8jax.quantize(jnp.asarray(x), spec)
    x_hat, tel = fp8jax.quantize_dequantize(jnp.asarray(x), spec, telemetry=True)
    x_hat = np.asarray(x_hat, np.float64)
    row["scale_inv shape"] = str(tuple(qt.scale_inv.shape))
    row["block"] = "x".join(map(str, qt.full_block))
    row[f"{fmt} bulk SNR dB"] = fp8_study.snr_db(x[bulk].astype(np.float64), x_hat[bulk])
    row[f"{fmt} flushed"] = float(tel.underflow_frac)
  tile_rows.append(row)
print(f"x: {x.shape} N(0, 1), one value = {OUTLIER:g}")
print_table(tile_rows, ["granularity", "scale_inv shape", "block", "e4m3 bulk SNR dB",
                        "e4m3 flushed", "e5m2 bulk SNR dB", "e5m2 flushed"])

# %% [markdown]
# The same with more outliers: a fraction 1e-3 of the values is set to ±ratio, for growing
# ratios (`fp8_study.quantization_snr`, the function behind the repository's numerics
# report). With outliers this common, a 128x128 block usually holds several of them, a
# 1x128 tile rarely more than one.

# %%
snr_sizes = fp8_study.StudySizes(
    tokens=TOKENS, channels=CHANNELS,
    outlier_ratios=(1e1, 1e3, 1e5) if SMOKE else (1e1, 1e2, 1e3, 1e4, 1e5, 1e6))
snr_rows = fp8_study.quantization_snr(snr_sizes)

fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
for ax, fmt in zip(axes, ("e4m3", "e5m2")):
  for name in fp8_study.GRANULARITIES:
    rows = [r for r in snr_rows if r["format"] == fmt and r["granularity"] == name]
    ax.plot([r["outlier_ratio"] for r in rows], [r["bulk_snr_db"] for r in rows], marker="o",
            label=name)
  ax.set(xscale="log", xlabel="outlier magnitude / typical magnitude", title=fmt)
axes[0].set_ylabel("SNR of the ordinary values (dB)")
axes[1].legend()
fig.tight_layout()
plt.show()

worst = max(snr_sizes.outlier_ratios)
print_table([r for r in snr_rows if r["outlier_ratio"] == worst],
            ["format", "granularity", "bulk_snr_db", "snr_db", "underflow_frac"],
            title=f"outlier ratio {worst:g}")

# %% [markdown]
# ## 3. Scale formats: FP32 or a power of two
#
# A float32 scale maps each block's amax exactly onto the format's maximum. A power-of-two
# scale can be stored in one byte (E8M0: exponent only) and applied by exponent arithmetic,
# exactly and identically on every platform, but it only reaches the nearest power of two:
#
# * `floor` rounds `s` down: the amax lands between half the maximum and the maximum;
# * `ceil` rounds `s` up: up to twice the maximum, so the block's largest values saturate;
# * `rceil` rounds `scale_inv` up (DeepGEMM's UE8M0 rule, MXFP8): like `floor`, except where
#   the float32 reciprocal rounds across a power of two.
#
# The fraction of E4M3's range that a block's amax uses, over two binades of amax:

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

# %% [markdown]
# On a tensor whose rows differ in magnitude by up to four orders (1x128 tiles): the SNR,
# the fraction saturated (clipped) and flushed, the mean fraction of the range that the
# tiles' largest payloads use, and what the scales cost in memory.

# %%
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
      "SNR dB": fp8_study.snr_db(x_rows.astype(np.float64), x_hat),
      "saturated": float(tel.saturated_frac), "flushed": float(tel.underflow_frac),
      "range used": float(np.mean(payload.max(-1)) / E4M3.max)})
print_table(scale_rows)
e8m0_lossless = np.array_equal(dequantized["pow2 rceil"], dequantized["pow2 rceil, E8M0"])
print("E8M0 storage changes no dequantized value:", e8m0_lossless)

# %% [markdown]
# E8M0 is for storing scales that are already powers of two. Converting an arbitrary float
# with `astype(float8_e8m0fnu)` rounds to the *nearest* power of two and turns 0 into NaN;
# fp8jax builds its power-of-two scales by exponent arithmetic (`fp8jax.round_pow2`) instead.

# %%
v = np.array([0.0, 0.75, 2.9, 3.0, 5.0], np.float32)
print_table([{"v": float(a), "astype(e8m0)": float(b), "round_pow2 floor": float(c),
              "round_pow2 ceil": float(d)}
             for a, b, c, d in zip(v, v.astype(ml_dtypes.float8_e8m0fnu).astype(np.float32),
                                   np.asarray(fp8jax.round_pow2(jnp.asarray(v), "floor")),
                                   np.asarray(fp8jax.round_pow2(jnp.asarray(v), "ceil")))])

# %% [markdown]
# ## 4. Accumulation precision
#
# Inside an FP8 GEMM the products of two FP8 numbers are exact; what matters is how they
# are summed over K. fp8jax offers FP32 accumulation and a bit-exact model of Hopper
# tensor-core accumulation (blocks of 32 products aligned to the largest exponent, 13
# fraction bits, truncation). DeepSeek-V3 keeps that error in check by *promoting* the
# partial sum to an FP32 register every 128 elements of K.
#
# Here `fp8_study.accumulation_error` (the function behind the repository's numerics
# report) quantizes A [M, K] and B [N, K] to E4M3 with per-tensor scales (constant along K,
# so every accumulator applies) and multiplies them with each accumulator
# (`accumulate.scaled_matmul`, the product inside `fp8jax.fp8_dot_general`). The reference
# is the float64 product of the same dequantized operands, so the error is that of the
# accumulation alone. "positive" operands are U(0, 1) (all products of one sign, the worst
# case for truncation), "gaussian" ones N(0, 1), "outliers" N(0, 1) with 1% of the
# K-channels 100 times larger. For comparison, DeepSeek-V3 quotes a maximum relative error
# of nearly 2% at K = 4096 without promotion; how close the model comes depends on the
# operands' signs and on the error measure (normwise, solid lines; largest elementwise,
# dashed).

# %%
KS = (256, 1024) if SMOKE else (256, 512, 1024, 2048, 4096, 8192, 16384)
GEMM_ROWS = 16 if SMOKE else 64
acc_rows = fp8_study.accumulation_error(
    fp8_study.StudySizes(ks=KS, gemm_rows=GEMM_ROWS))
dists = list(fp8_study.DISTRIBUTIONS)
acc_names = list(fp8_study.ACCUMULATORS)
print_table([{"distribution": d, "K": k,
              **{n: r["norm_rel"] for n in acc_names for r in acc_rows
                 if (r["distribution"], r["k"], r["accumulator"]) == (d, k, n)}}
             for d in dists for k in KS],
            title="normwise relative error ||Y - Y_ref|| / ||Y_ref||")

fig, axes = plt.subplots(1, len(dists), figsize=(5 * len(dists), 4), sharey=True)
for ax, dist in zip(axes, dists):
  for name in acc_names:
    rows = [r for r in acc_rows if r["distribution"] == dist and r["accumulator"] == name]
    line, = ax.plot(KS, [r["norm_rel"] for r in rows], marker="o", label=f"{name}, norm")
    ax.plot(KS, [r["max_rel"] for r in rows], ls="--", color=line.get_color(),
            label=f"{name}, max elementwise")
  ax.set(xscale="log", yscale="log", xlabel="K", title=f"{dist} operands")
axes[0].set_ylabel("relative error vs float64")
axes[-1].legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The whole DeepSeek-V3 forward GEMM (1x128 input tiles, 128x128 weight blocks) against the
# float64 product of the *unquantized* operands, so quantization and accumulation together,
# next to BF16 and to per-tensor scaling without promotion, for operands with a few outlier
# channels along K.

# %%
PER_TENSOR = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.per_tensor())
PER_TENSOR_ROLES = fp8jax.RoleSpecs(input=PER_TENSOR, weight=PER_TENSOR, grad=PER_TENSOR)
A_BT = (((1,), (1,)), ((), ()))  # contract A [M, K] with B [N, K] over K


@functools.partial(jax.jit, static_argnums=2)
def fp8_gemm(a, b, config):
  return fp8jax.fp8_dot_general(a, b, A_BT, config=config, preferred_element_type=jnp.float32)


K_RECIPE = KS[-1] if SMOKE else 4096
rng = np.random.default_rng(1)
a, b = (jnp.asarray(t, jnp.float32)
        for t in fp8_study.gemm_operands("outliers", GEMM_ROWS * 2, K_RECIPE, rng))
ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
RECIPES = {
    "bf16": fp8jax.gemm.dense.BF16,
    "per-tensor, tc, no promotion": fp8jax.GemmConfig(
        roles=PER_TENSOR_ROLES, accumulation=accumulate.HOPPER_NO_PROMOTION),
    "per-tensor, fp32 acc": fp8jax.GemmConfig(roles=PER_TENSOR_ROLES),
    "deepseek-v3 blocks, tc, promote every 128": fp8jax.gemm.dense.HOPPER_BLOCKWISE,
    "deepseek-v3 blocks, fp32 acc": fp8jax.gemm.dense.FP32_BLOCKWISE,
}
recipe_rows = []
for name, cfg in RECIPES.items():
  y = np.asarray(fp8_gemm(a, b, cfg), np.float64)
  metrics = fp8_study.error_metrics(y, ref)
  recipe_rows.append({"GEMM": name, "config": cfg.describe(), "norm_rel": metrics["norm_rel"],
                      "max_over_range": metrics["max_over_range"]})
print_table(recipe_rows, title=f"[{a.shape[0]}, {K_RECIPE}] x [{K_RECIPE}, {b.shape[0]}], "
                               "error vs float64 of the unquantized operands")

# %% [markdown]
# ## 5. Transposed operands
#
# The backward GEMMs need the transposes of tensors quantized for the forward GEMM: the
# weight gradient contracts X and dY over the tokens, so their 1x128 tiles must run along
# the tokens instead of the channels. Three ways to produce them (`fp8jax.gemm.transpose`):
#
# * `requant`: quantize the saved high-precision tensor again, transposed (one rounding);
# * `double`: dequantize the FP8 tensor and quantize its transpose (two roundings);
# * `scaling_aware`: re-express the FP8 payload with the new tiles' scales, without going
#   back through high precision; with power-of-two scales this is a shift of exponents,
#   exact except for values pushed below the smallest subnormal.
#
# First the transposed tensor itself (`fp8_study.double_quant_error`: rows of
# different magnitude, FP32 and power-of-two `rceil` scales), against the unquantized
# transpose:

# %%
dq_rows = fp8_study.double_quant_error(
    fp8_study.StudySizes(tokens=TOKENS, channels=CHANNELS))
print_table(dq_rows, ["scale_format", "policy", "snr_db", "changed_vs_requant",
                      "changed_vs_forward_values"])

fig, ax = plt.subplots(figsize=(6, 3.5))
policies = list(fp8jax.gemm.transpose.POLICIES)
for i, scale_format in enumerate(("fp32", "pow2")):
  snrs = [next(r["snr_db"] for r in dq_rows
               if r["scale_format"] == scale_format and r["policy"] == p) for p in policies]
  ax.bar(np.arange(len(policies)) + 0.4 * i, snrs, width=0.4, label=f"{scale_format} scales")
ax.set_xticks(np.arange(len(policies)) + 0.2, policies)
ax.set(ylabel="SNR of the transposed tensor (dB)", ylim=(min(r["snr_db"] for r in dq_rows) - 3,
                                                        max(r["snr_db"] for r in dq_rows) + 1))
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# Then the weight gradient itself: `jax.vjp` through `fp8jax.fp8_dot_general` with the
# DeepSeek-V3 roles, BF16 Fprop and Dgrad and an FP8 Wgrad, for each transpose policy
# (`GemmConfig(transpose=...)`), against the float64 `dW = Xᵀ dY`.

# %%
M, K_IN, N_OUT = (256, 256, 128) if SMOKE else (1024, 1024, 512)
x_act = (rng.standard_normal((M, K_IN)) * 10.0 ** rng.uniform(-1, 1, (M, 1))).astype(np.float32)
w = (rng.standard_normal((K_IN, N_OUT)) / np.sqrt(K_IN)).astype(np.float32)
dy = (rng.standard_normal((M, N_OUT)) * 10.0 ** rng.uniform(-1, 1, (M, 1))).astype(np.float32)
dw_ref = x_act.astype(np.float64).T @ dy.astype(np.float64)
X_W = (((1,), (0,)), ((), ()))  # X [M, K] . W [K, N]


@functools.partial(jax.jit, static_argnums=3)
def weight_grad(x, w, dy, config):
  _, vjp = jax.vjp(lambda w_: fp8jax.fp8_dot_general(x, w_, X_W, config=config), w)
  return vjp(dy)[0]


ROLE_SETS = {"fp32": fp8jax.deepseek_v3_roles(),
             "pow2": fp8jax.deepseek_v3_roles().replace_all(scale_format="pow2",
                                                            pow2_rounding="rceil")}
wgrad_rows = []
for scale_format, roles in ROLE_SETS.items():
  for policy in policies:
    cfg = fp8jax.GemmConfig(roles=roles, fprop="bf16", dgrad="bf16", transpose=policy)
    dw = np.asarray(weight_grad(x_act, w, dy, cfg), np.float64)
    wgrad_rows.append({"scale_format": scale_format, "policy": policy,
                       "dW norm_rel": fp8_study.error_metrics(dw, dw_ref)["norm_rel"]})
print_table(wgrad_rows)

# %% [markdown]
# ## What the numbers show
#
# The cell after this one checks each statement below against the numbers computed above,
# so the notebook fails instead of claiming something its numbers no longer show.
#
# * **Formats.** E4M3 is the finer grid (relative spacing at most `2**-3` over its normal
#   range, against `2**-2` for E5M2), E5M2 the wider one (max 57344 against 448). A plain
#   cast turns overflow into NaN (E4M3) or inf (E5M2); the saturating cast never does.
# * **Tiles against outliers.** With one large outlier, per-tensor scaling loses the most
#   SNR on the ordinary values and flushes some of them to zero, while 1x128 tiles keep the
#   ordinary values' SNR close to that of the tensor quantized without any outlier: only
#   the outlier's own tile is affected. As outliers become larger, E4M3's per-tensor SNR
#   falls, and 1x128 tiles stay ahead of 128x128 blocks, which hold several outliers each.
#   E5M2's wider range absorbs the outliers, at a lower SNR throughout.
# * **Scale formats.** Power-of-two scales (`floor`, `rceil`) use between half and all of
#   the range, and give up only a fraction of a dB of SNR against FP32 scales; rounding
#   the scale up (`ceil`) saturates the largest values and costs far more. Storing
#   power-of-two scales as E8M0 changes no value and takes one byte per scale instead of
#   four.
# * **Accumulation.** FP32 accumulation adds an error at the level of float32 rounding,
#   whatever K. The tensor-core model without promotion is much worse and its error grows
#   with K, fastest when all products have one sign. Promotion every 128 elements keeps the
#   tensor-core error flat in K. In the complete GEMM it is small next to the error of
#   quantizing the operands: the DeepSeek-V3 blocks give the same error with promotion as
#   with FP32 accumulation, less than per-tensor scaling on operands with outlier channels,
#   and still clearly more than BF16.
# * **Transposes.** With FP32 scales, re-quantizing from high precision is the most
#   accurate; a double quantization and the scaling-aware transpose both add a second
#   rounding and lose SNR, in the transposed tensor and in the weight gradient. With
#   power-of-two scales the three policies agree almost exactly (the re-scaling is exact
#   except for values pushed below the smallest subnormal), and the scaling-aware transpose
#   keeps nearly every value of the forward pass's tensor.

# %%
def row(rows, **match):
  """The one row of ``rows`` whose fields equal ``match``."""
  (found,) = [r for r in rows if all(r[k] == v for k, v in match.items())]
  return found


def by_name(rows, key, value_key):
  return {r[key]: r[value_key] for r in rows}


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
clean_snr = fp8_study.snr_db(
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

# Accumulation.
for dist in ("positive", "gaussian"):
  fp32, never, every128 = ([row(acc_rows, distribution=dist, k=k, accumulator=n)["norm_rel"]
                            for k in KS] for n in acc_names)
  assert max(fp32) < 1e-6 and min(every128) > 100 * max(fp32)
  assert never[-1] > 2 * never[0] and never[-1] > 2 * every128[-1]
  assert max(every128) < 1.5 * min(every128)
positive_never = [row(acc_rows, distribution="positive", k=k, accumulator="tc, no promotion")
                  for k in KS]
gaussian_never = [row(acc_rows, distribution="gaussian", k=k, accumulator="tc, no promotion")
                  for k in KS]
assert (positive_never[-1]["norm_rel"] / positive_never[0]["norm_rel"]
        > gaussian_never[-1]["norm_rel"] / gaussian_never[0]["norm_rel"])
recipe = by_name(recipe_rows, "GEMM", "norm_rel")
assert abs(recipe["deepseek-v3 blocks, tc, promote every 128"]
           - recipe["deepseek-v3 blocks, fp32 acc"]) < 0.01 * recipe["deepseek-v3 blocks, fp32 acc"]
assert recipe["deepseek-v3 blocks, fp32 acc"] < recipe["per-tensor, fp32 acc"]
assert recipe["bf16"] < 0.5 * min(v for k, v in recipe.items() if k != "bf16")

# Transposes.
fp32_dq = {r["policy"]: r for r in dq_rows if r["scale_format"] == "fp32"}
pow2_dq = {r["policy"]: r for r in dq_rows if r["scale_format"] == "pow2"}
assert fp32_dq["requant"]["snr_db"] > max(fp32_dq["double"]["snr_db"],
                                          fp32_dq["scaling_aware"]["snr_db"]) + 1
assert all(abs(r["snr_db"] - pow2_dq["requant"]["snr_db"]) < 0.1 for r in pow2_dq.values())
assert pow2_dq["scaling_aware"]["changed_vs_forward_values"] < 0.01
fp32_dw = {r["policy"]: r["dW norm_rel"] for r in wgrad_rows if r["scale_format"] == "fp32"}
pow2_dw = {r["policy"]: r["dW norm_rel"] for r in wgrad_rows if r["scale_format"] == "pow2"}
assert fp32_dw["requant"] < min(fp32_dw["double"], fp32_dw["scaling_aware"])
assert max(pow2_dw.values()) < 1.01 * min(pow2_dw.values())
print(f"every statement holds; the notebook ran in {time.time() - START:.0f} s")
