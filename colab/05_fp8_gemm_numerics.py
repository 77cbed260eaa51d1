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
# # FP8 GEMMs: accumulation and transposed operands
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fp8jax/fp8jax/blob/main/colab/05_fp8_gemm_numerics.ipynb)
#
# The second part of the FP8 numerics tour (`01_fp8_numerics_tour`: formats, granularity,
# scale formats): inside the GEMM, how the products are **accumulated**, and how the
# **transposed operands** of the backward GEMMs are produced, measured with `fp8jax`'s
# simulation of FP8 numerics (including a bit-exact model of Hopper tensor-core
# accumulation), on a CPU as on a GPU. Every number below is computed when the notebook
# runs. `FP8JAX_SMOKE=1` gives a small version (well under a minute on one CPU core; CI runs
# it); the full size takes a minute or two.
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
import functools

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import fp8jax
from fp8jax.gemm import accumulate
from fp8jax.study import notebook
from fp8jax.study.formats import fp8_sections
from fp8jax.study.notebook import show_table

NB = notebook.start()  # versions, devices, and the size: FP8JAX_SMOKE=1 is CI's small one
SMOKE = NB.smoke

# %% [markdown]
# ## 1. Accumulation precision
#
# The products of two FP8 numbers are exact; what matters is how they are summed over K.
# fp8jax offers FP32 accumulation and a bit-exact model of Hopper tensor-core accumulation
# (blocks of 32 products aligned to the largest exponent, 13 fraction bits, truncation);
# DeepSeek-V3 *promotes* the partial sum to FP32 every 128 elements of K.
# `fp8_sections.accumulation_error` quantizes A [M, K] and B [N, K] to E4M3 with
# per-tensor scales and multiplies them with each accumulator (`accumulate.scaled_matmul`);
# the reference is the float64 product of the same dequantized operands, so the error is the
# accumulation's alone. Operands: "positive" U(0, 1) (one sign, the worst case for
# truncation), "gaussian" N(0, 1), "outliers" N(0, 1) with 1% of the K-channels 100x larger.
# DeepSeek-V3 quotes nearly 2% maximum relative error at K = 4096 without promotion; how
# close the model comes depends on the signs and the measure (normwise solid, largest
# elementwise dashed).

# %%
TOKENS, CHANNELS = (256, 512) if SMOKE else (1024, 2048)
KS = (256, 1024) if SMOKE else (256, 512, 1024, 2048, 4096, 8192, 16384)
GEMM_ROWS = 16 if SMOKE else 64
acc_rows = fp8_sections.accumulation_error(
    fp8_sections.StudySizes(ks=KS, gemm_rows=GEMM_ROWS))
dists = list(fp8_sections.DISTRIBUTIONS)
acc_names = list(fp8_sections.ACCUMULATORS)
show_table([{"distribution": d, "K": k,
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

# %%
# The whole DeepSeek-V3 forward GEMM (1x128 input tiles, 128x128 weight blocks) against the
# float64 product of the *unquantized* operands (quantization and accumulation together),
# next to BF16 and per-tensor scaling, for operands with a few outlier channels along K.
PER_TENSOR = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.per_tensor())
PER_TENSOR_ROLES = fp8jax.RoleSpecs(input=PER_TENSOR, weight=PER_TENSOR, grad=PER_TENSOR)
A_BT = (((1,), (1,)), ((), ()))  # contract A [M, K] with B [N, K] over K


@functools.partial(jax.jit, static_argnums=2)
def fp8_gemm(a, b, config):
  return fp8jax.fp8_dot_general(a, b, A_BT, config=config, preferred_element_type=jnp.float32)


K_RECIPE = KS[-1] if SMOKE else 4096
rng = np.random.default_rng(1)
a, b = (jnp.asarray(t, jnp.float32)
        for t in fp8_sections.gemm_operands("outliers", GEMM_ROWS * 2, K_RECIPE, rng))
ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
RECIPES = {
    "bf16": fp8jax.gemm.dense.BF16,
    "per-tensor, tc, no promotion": fp8jax.GemmConfig(
        roles=PER_TENSOR_ROLES, accumulation=accumulate.HOPPER_NO_PROMOTION),
    "per-tensor, fp32 acc": fp8jax.GemmConfig(roles=PER_TENSOR_ROLES),
    "deepseek-v3 blocks, tc, promote every 128": fp8jax.gemm.dense.DEEPSEEK_V3,
    "deepseek-v3 blocks, fp32 acc": fp8jax.gemm.dense.FP32_BLOCKWISE,
}
recipe_rows = []
for name, cfg in RECIPES.items():
  y = np.asarray(fp8_gemm(a, b, cfg), np.float64)
  metrics = fp8_sections.error_metrics(y, ref)
  recipe_rows.append({"GEMM": name, "config": cfg.describe(), "norm_rel": metrics["norm_rel"],
                      "max_over_range": metrics["max_over_range"]})
show_table(recipe_rows, title=f"[{a.shape[0]}, {K_RECIPE}] x [{K_RECIPE}, {b.shape[0]}], "
                               "error vs float64 of the unquantized operands")

# %% [markdown]
# ## 2. Transposed operands
#
# The weight gradient contracts X and dY over the tokens, so their 1x128 tiles must run
# along the tokens, not the channels. Three ways to get them (`fp8jax.gemm.transpose`):
# `requant` quantizes the saved high-precision tensor again, transposed (one rounding);
# `double` dequantizes the FP8 tensor and quantizes its transpose (two roundings);
# `scaling_aware` re-expresses the FP8 payload with the new tiles' scales (with power-of-two
# scales a shift of exponents, exact except below the smallest subnormal). First the
# transposed tensor (`fp8_sections.double_quant_error`) against the unquantized transpose:

# %%
dq_rows = fp8_sections.double_quant_error(
    fp8_sections.StudySizes(tokens=TOKENS, channels=CHANNELS))
show_table(dq_rows, ["scale_format", "policy", "snr_db", "changed_vs_requant",
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

# %%
# The weight gradient: `jax.vjp` through `fp8jax.fp8_dot_general` with the DeepSeek-V3
# roles, BF16 Fprop and Dgrad and an FP8 Wgrad, per transpose policy, against float64 Xᵀ dY.
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
                       "dW norm_rel": fp8_sections.error_metrics(dw, dw_ref)["norm_rel"]})
show_table(wgrad_rows)

# %% [markdown]
# ## What the numbers show
#
# Each statement is checked against the numbers above, so the notebook fails instead of
# claiming something its numbers no longer show.
#
# * **Accumulation.** FP32 accumulation errs at float32 rounding level, whatever K. The
#   tensor-core model without promotion is much worse and grows with K, fastest when all
#   products have one sign; promotion every 128 keeps it flat in K. In the complete GEMM the
#   DeepSeek-V3 blocks give the same error with promotion as with FP32 accumulation, less
#   than per-tensor scaling on outlier channels, and clearly more than BF16.
# * **Transposes.** With FP32 scales re-quantizing is the most accurate; `double` and
#   `scaling_aware` add a second rounding, in the transposed tensor and in dW. With
#   power-of-two scales the three agree almost exactly, and `scaling_aware` keeps nearly
#   every value of the forward pass's tensor.

# %%
row = notebook.row  # the one row whose fields equal the keywords
by_name = lambda rows, key, value: {r[key]: r[value] for r in rows}
# Accumulation.
for dist in ("positive", "gaussian"):
  fp32, never, every128 = ([row(acc_rows, distribution=dist, k=k, accumulator=n)["norm_rel"]
                            for k in KS] for n in acc_names)
  assert max(fp32) < 1e-6 and min(every128) > 100 * max(fp32)
  assert never[-1] > 2 * never[0] and never[-1] > 2 * every128[-1]
  assert max(every128) < 1.5 * min(every128)
never = {d: [row(acc_rows, distribution=d, k=k, accumulator="tc, no promotion")["norm_rel"]
             for k in KS] for d in ("positive", "gaussian")}
assert never["positive"][-1] / never["positive"][0] > never["gaussian"][-1] / never["gaussian"][0]
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
print(f"every statement holds; the notebook ran in {NB.elapsed():.0f} s")
