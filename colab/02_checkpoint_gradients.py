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
# # One checkpoint, BF16 vs FP8 gradients
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fp8jax/fp8jax/blob/main/colab/02_checkpoint_gradients.ipynb)
#
# The precision study asks how FP8 changes the *gradients* of a DeepSeek-MoE model before it
# changes its loss. Its unit of work is one comparison: the gradient of the training
# objective (LM loss plus balance loss) at one checkpoint, on one batch, once in BF16 and
# once under an FP8 precision policy. This notebook makes that comparison by hand:
#
# 1. a tiny DeepSeek-MoE is trained for a few steps on the embedded English corpus (or an
#    existing run is loaded), and one checkpoint is restored;
# 2. `fp8jax.study.comparison.paired.PairedEvaluator`, the engine of the study's sweep,
#    compares a few FP8 policies against BF16 on one batch;
# 3. `jax.grad` gives the full gradient trees, browsed with treescope;
# 4. the difference is broken down per module, layer, module x layer cell and parameter,
#    next to the routing divergence of every MoE layer.
#
# Every number is computed when the notebook runs. `FP8JAX_SMOKE=1` gives a small version
# (about a minute on one CPU core; CI runs it); the full size takes a few minutes on a CPU.
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
import json
import math
import pathlib
import tempfile

import jax
import jax.numpy as jnp
from matplotlib import colors
import matplotlib.pyplot as plt
import ml_collections
import numpy as np

from fp8jax import metrics
from fp8jax.experiments.configs import train_tiny
from fp8jax.metrics import ranking
from fp8jax.models import deepseek_moe, param_paths
from fp8jax.models import policy as policy_lib
from fp8jax.study import notebook
from fp8jax.study.comparison import paired, sweep
from fp8jax.study.notebook import show_table
from fp8jax.train import checkpoint as ckpt_lib
from fp8jax.train import loop, run_config
from fp8jax.train import mesh as mesh_lib

NB = notebook.start()  # versions, devices, and the size: FP8JAX_SMOKE=1 is CI's small one

# %% [markdown]
# ## 1. A checkpoint
#
# `CHECKPOINT_DIR`: a training run's folder (the `--workdir` of
# `python -m fp8jax.experiments.train`); `None` trains the tiny demo model
# (`experiments/configs/train_tiny.py`: every layer MoE, byte tokens) in a temporary folder.
# `restore_params` checks every array against the digest recorded at saving (a damaged file
# raises `CorruptCheckpointError`); `python -m fp8jax.experiments.verify --workdir=RUN` checks
# a whole run.

# %%
CHECKPOINT_DIR = None   # e.g. "out/demo/train"
STEP = None             # a checkpoint step of that run; None: the latest
EVAL_BATCH = 8          # sequences in the evaluation batch

if CHECKPOINT_DIR is None:
  train_cfg = train_tiny.get_config()
  if NB.smoke:
    train_cfg.model_overrides.num_hidden_layers = 2
    train_cfg.train.steps, train_cfg.train.save_every, train_cfg.train.log_every = 4, 2, 2
    train_cfg.optim.warmup_steps = 1
  TMP = tempfile.TemporaryDirectory(prefix="fp8jax_checkpoint_")  # removed at kernel exit
  run_dir = pathlib.Path(TMP.name) / "train"
  summary = loop.train(train_cfg, run_dir, stream=sys.stdout)
  print(f"trained {summary['final_step']} steps into {run_dir}")
else:
  run_dir = pathlib.Path(CHECKPOINT_DIR)
  if run_dir.name == "checkpoints":
    run_dir = run_dir.parent
  train_cfg = ml_collections.ConfigDict(json.loads((run_dir / "config.json").read_text()))

model = run_config.model(train_cfg)  # the run's model, computing as the run did
model_cfg = model.config  # DeepSeek-MoE's config
MOE_IMPL = train_cfg.train.moe_impl
NUM_LAYERS = model_cfg.num_hidden_layers
mesh = mesh_lib.data_mesh()
ckpt = ckpt_lib.Checkpointer(run_dir / "checkpoints", save_every=1)
available = ckpt.all_steps()
step = available[-1] if STEP is None else int(STEP)
abstract = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=mesh_lib.replicated(mesh)),
    deepseek_moe.abstract_params(model_cfg))
params, ckpt_meta = ckpt.restore_params(step, abstract)
ckpt.close()
verified = "verified against their digests" if "digests" in ckpt_meta else "no digests"
print(f"checkpoints {available}; restored step {step} (code {ckpt_meta.get('code_version')}; "
      f"params {verified})")
print(model_cfg)

# %% [markdown]
# The params are a plain nested dict: token embedding, `layers/<i>/...` (attention, the two
# RMSNorms, and in MoE layers the router `mlp/gate`, the shared experts and the routed
# experts stacked along a leading axis `mlp/experts_*`), the final norm and the LM head.
# treescope shows the tree in a notebook; a script prints one line per leaf.

# %%
flat_params = metrics.flatten(params)
n_params = sum(int(np.prod(v.shape)) for v in flat_params.values())
print(f"{len(flat_params)} parameter arrays, {n_params:,} parameters")
notebook.show_tree(params)

# %% [markdown]
# ## 2. One batch, several FP8 policies
#
# The evaluation batch is drawn as the study's sweep draws it (`sweep.eval_batches`). The
# policies are expressions of `fp8jax.models.policy.parse_policy`, here from the site grid:
# the site (`attn` output or `moe` block output), the layers (`l0`, or `l0-<last>`) and the
# format (per-tensor current scaling). Any expression works, e.g.
# `"attn@0-1:e4m3/1x128+gemm:fp32_blockwise"`. `PairedEvaluator` jits the BF16 pass once and
# one pass per policy; only the comparison (`fp8jax.metrics.compare_grads`), the routing
# divergence and finiteness flags come back from the device.

# %%
POLICIES = ["attn_l0_e4m3", f"moe_l0-{NUM_LAYERS - 1}_e5m2"]

policies = [policy_lib.parse_policy(p) for p in POLICIES]
windows = sweep.Windows(offsets=(0,), batches=1, batch_size=EVAL_BATCH)
tokens = mesh_lib.global_batch(sweep.eval_batches(train_cfg, windows)[(0, 0)], mesh)
print("evaluation batch:", tokens.shape, tokens.dtype)

evaluator = paired.PairedEvaluator(model, policies, mesh)
base = evaluator.baseline(params, tokens)
results = {p: jax.device_get(evaluator.variant(p, params, tokens, base)) for p in POLICIES}
direct = {p.name: param_paths.direct_modules(p, NUM_LAYERS) for p in policies}

GLOBAL = {"‖g_fp8 − g_bf16‖": "diff_norm", "‖g_bf16‖": "norm_bf16", "rel_err": "rel_err",
          "cosine": "cosine"}
show_table([{"policy": p, "finite": bool(r["finite"]), "loss BF16": float(base.loss),
             "loss FP8": float(r["compare"]["loss"]["loss_fp8"]),
             "loss rel. err": float(r["compare"]["loss"]["loss_rel_err"]),
             **{k: float(r["compare"]["global"][v]) for k, v in GLOBAL.items()},
             "share_direct": float(r["compare"]["direct"]["share_direct"])}
            for p, r in results.items()], title=f"checkpoint {step}, one batch")

# %% [markdown]
# `rel_err` is ‖g_fp8 − g_bf16‖ / ‖g_bf16‖ over the whole tree, `cosine` the cosine of the
# two gradients, `share_direct` the fraction of ‖g_fp8 − g_bf16‖² in the modules whose output
# the policy quantizes *directly* (attention output for `attn`, the experts for `moe`); the
# rest travelled to other parameters through activations and cotangents.
#
# ## 3. The full gradient trees
#
# The BF16 baseline holds the whole BF16 tree (`base.grads`, routing in `base.routing`); the
# FP8 tree of the first policy comes from `jax.grad` of the same objective. Their difference
# norm matches the evaluator's.

# %%
FOCUS = POLICIES[0]


def objective(policy):
  def loss_fn(p, toks):
    logits, aux = deepseek_moe.apply(p, toks, model_cfg, policy, moe_impl=MOE_IMPL)
    return deepseek_moe.lm_loss(logits, toks) + aux["aux_loss"], aux["routing"]
  return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))


loss_b, routing_b, grads_b = base.loss, base.routing, base.grads
(loss_f, routing_f), grads_f = objective(policy_lib.parse_policy(FOCUS))(params, tokens)
grad_diff = jax.tree.map(lambda f, b: f - b, grads_f, grads_b)
tree_norm = lambda t: float(jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(t))))
evaluator_norm = float(results[FOCUS]["compare"]["global"]["diff_norm"])
print(f"{FOCUS}: ‖g_fp8 − g_bf16‖ from jax.grad {tree_norm(grad_diff):.6g}, "
      f"from the evaluator {evaluator_norm:.6g}")

# %%
# The difference tree `g_fp8 − g_bf16`, every array drawn as a heatmap (expand a node).
notebook.show_tree(grad_diff, autovisualize=True)

# %%
# Up close: the parameter whose gradient moved most (L2 norm), its difference and its BF16
# gradient, each on its own colour scale, symmetric around zero.
focus_values = metrics.per_param(results[FOCUS]["compare"])
top_path = ranking.top_k(focus_values, 1)[0]
top_diff = metrics.flatten(grad_diff)[top_path]
top_bf16 = metrics.flatten(grads_b)[top_path]
print(f"{top_path}: shape {tuple(top_diff.shape)}, ‖Δg‖ {float(jnp.linalg.norm(top_diff)):.4g}, "
      f"‖g_bf16‖ {float(jnp.linalg.norm(top_bf16)):.4g}")
if NB.interactive and importlib.util.find_spec("treescope"):
  import treescope
  for label, array in (("g_fp8 − g_bf16", top_diff), ("g_bf16", top_bf16)):
    vmax = float(jnp.max(jnp.abs(array)))
    treescope.show(f"{label}:", treescope.render_array(array, vmin=-vmax, vmax=vmax))

# %% [markdown]
# ## 4. Where the difference sits
#
# `compare_grads` groups the per-leaf sums of squares by module, layer and module x layer
# cell, so the `share` columns (a group's part of ‖g_fp8 − g_bf16‖²) add up to 1 over the
# modules and over the layers (layer `none`: embedding, final norm, head). `direct` marks the
# directly quantized modules; the layer tables add the fraction of tokens rerouted there.

# %%
def group_rows(result, grouping, key_name, policy):
  """One row per group: its metrics, its share of ‖g_fp8 − g_bf16‖² and 1 − cosine."""
  table = result["compare"][grouping]
  total_sq = float(result["compare"]["global"]["diff_norm"]) ** 2
  order = (param_paths.MODULES.index if grouping == "by_module"  # else layers, then "none"
           else lambda k: (k == "none", int(k) if k.isdigit() else 0))
  rows = [{key_name: key, **{k: float(v) for k, v in table[key].items()}}
          for key in sorted(table, key=order)]
  for row in rows:
    row.update({"share": row["diff_norm"] ** 2 / total_sq, "1 − cosine": 1 - row["cosine"],
                "direct": any(m == row[key_name] for m, _ in direct[policy])})
  return rows


for p, r in results.items():
  show_table(group_rows(r, "by_module", "module", p),
             ["module", "direct", "diff_norm", "norm_bf16", "rel_err", "1 − cosine", "share"],
             title=f"{p}: per module")
  rerouted = {str(layer): float(d["topk_set_diff_frac"]) for layer, d in r["routing"].items()}
  show_table([{**row, "tokens rerouted": rerouted.get(row["layer"])}
              for row in group_rows(r, "by_layer", "layer", p)],
             ["layer", "diff_norm", "norm_bf16", "rel_err", "1 − cosine", "share",
              "tokens rerouted"], title=f"{p}: per layer")

# %%
# The module x layer view (`fp8jax.metrics.heatmap`), log colour scales; directly quantized
# cells are outlined.
fig, axes = plt.subplots(2, len(results), figsize=(5.5 * len(results), 7), squeeze=False)
for col, (p, r) in enumerate(results.items()):
  for row, metric in enumerate(("diff_norm", "rel_err")):
    ax = axes[row, col]
    modules, layers, table = metrics.heatmap(r["compare"], metric, classifier=param_paths.DEEPSEEK)
    ok = table[np.isfinite(table) & (table > 0)]
    norm = colors.LogNorm(ok.min(), ok.max()) if ok.size else None
    im = ax.imshow(np.ma.masked_invalid(table), aspect="auto", cmap="viridis", norm=norm)
    for m, layer in direct[p]:
      if m in modules and layer in layers:
        ax.add_patch(plt.Rectangle((layers.index(layer) - 0.5, modules.index(m) - 0.5), 1, 1,
                                   fill=False, edgecolor="red", lw=2))
    ax.set_yticks(range(len(modules)), modules, fontsize=8)
    ax.set_xticks(range(len(layers)), [str(x) for x in layers])
    ax.set(xlabel="layer", title=f"{p}: {metric}")
    fig.colorbar(im, ax=ax)
fig.tight_layout()
plt.show()

# %%
# The parameters with the largest difference norm (`ranking.top_k`), the list whose
# migration across checkpoints the study follows.
TOP_K = 10
for p, r in results.items():
  values = metrics.per_param(r["compare"])
  rel = metrics.per_param(r["compare"], "rel_err")
  is_direct = metrics.as_predicate(direct[p], param_paths.DEEPSEEK)
  show_table([{"rank": i + 1, "parameter": f"`{path}`", "module": param_paths.module_of(path),
               "diff_norm": values[path], "rel_err": rel[path], "direct": is_direct(path)}
              for i, path in enumerate(ranking.top_k(values, TOP_K))],
             title=f"{p}: top-{TOP_K} parameters by ‖g_fp8 − g_bf16‖")

# %% [markdown]
# ## 5. Routing divergence
#
# A perturbed activation can send a token to other experts. Per MoE layer: the fraction of
# tokens whose top-k *set* (or ordered list) differs, the mean overlap of the two sets, and
# the experts each variant activates.

# %%
for p, r in results.items():
  show_table([{"layer": d["layer"], "set differs": d["topk_set_diff_frac"],
               "order differs": d["topk_ordered_diff_frac"],
               "mean overlap": d["topk_mean_overlap"],
               "tokens": f"{d['n_tokens_diff']} of {d['n_tokens']}",
               "active BF16": d["n_active_a"], "active FP8": d["n_active_b"],
               "only BF16": d["only_a"] or "-", "only FP8": d["only_b"] or "-"}
              for d in metrics.routing_rows(r["routing"])],
             title=f"{p}: routing divergence per MoE layer")

fig, ax = plt.subplots(figsize=(6, 3.5))
width = 0.8 / len(results)
for i, (p, r) in enumerate(results.items()):
  rows = metrics.routing_rows(r["routing"])
  ax.bar(np.arange(len(rows)) + i * width, [d["topk_set_diff_frac"] for d in rows], width,
         label=p)
ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2, [str(d["layer"]) for d in rows])
ax.set(xlabel="MoE layer", ylabel="fraction of tokens", title="top-k expert set differs")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 6. Union and intersection norms
#
# A routed expert that no token chose is *not activated* in that variant (gradient zero).
# Two ways to measure the difference of an expert stack:
#
# * **union** (the default `diff_norm`, `rel_err`): over every expert active in either
#   variant: union² = intersection² + Σ_{FP8 only} ‖g_fp8‖² + Σ_{BF16 only} ‖g_bf16‖²;
# * **intersection** (`diff_norm_intersection`, `rel_err_intersection`): the experts both
#   variants activate, the part of the difference not caused by routing.
#
# They coincide when both activate the same experts. The identity is checked on the trees of
# section 3.

# %%
COLUMNS = {"union": "diff_norm", "intersection": "diff_norm_intersection",
           "rel_err union": "rel_err", "rel_err intersection": "rel_err_intersection"}
for p, r in results.items():
  cells, div = r["compare"]["by_module_layer"], r["routing"]
  show_table([{"layer": layer, **{k: float(cells[f"routed_experts/{layer}"][v])
                                  for k, v in COLUMNS.items()},
               "experts only BF16": int(div[layer]["n_only_a"]),
               "experts only FP8": int(div[layer]["n_only_b"])} for layer in sorted(div)],
             title=f"{p}: routed experts, union vs intersection")


def expert_identity(layer):
  """(union², intersection² + one-sided terms) of a layer's routed experts, from the trees."""
  active_b = np.asarray(routing_b[layer]["expert_counts"]) > 0
  active_f = np.asarray(routing_f[layer]["expert_counts"]) > 0
  union = inter = one_sided = 0.0
  for name in ("experts_gate", "experts_up", "experts_down"):
    b = np.asarray(grads_b["layers"][layer]["mlp"][name], np.float64)
    f = np.asarray(grads_f["layers"][layer]["mlp"][name], np.float64)
    per_expert = lambda x: np.sum(x.reshape(x.shape[0], -1) ** 2, axis=1)
    union += per_expert(active_f[:, None, None] * f - active_b[:, None, None] * b).sum()
    inter += per_expert(f - b)[active_b & active_f].sum()
    one_sided += per_expert(f)[active_f & ~active_b].sum()
    one_sided += per_expert(b)[active_b & ~active_f].sum()
  return union, inter + one_sided


identity = {layer: expert_identity(layer) for layer in sorted(routing_b)}
print(f"{FOCUS}: union² vs intersection² + one-sided terms, per MoE layer: " + ", ".join(
    f"layer {layer} {lhs:.6g} vs {rhs:.6g}" for layer, (lhs, rhs) in identity.items()))
one_sided = {p: [layer for layer, d in r["routing"].items()
                 if int(d["n_only_a"]) or int(d["n_only_b"])] for p, r in results.items()}
for p, layers in one_sided.items():
  print(f"{p}: " + (f"experts active in one variant only in layers {layers}" if layers else
                    "both variants activate the same experts in every MoE layer, so union "
                    "and intersection coincide"))

# %% [markdown]
# ## Checks: the statements made above, on this run's numbers

# %%
for p, r in results.items():
  cmp = r["compare"]
  assert bool(r["finite"]), p
  total_sq = float(cmp["global"]["diff_norm"]) ** 2
  for grouping in ("by_module", "by_layer"):
    parts = sum(float(v) ** 2 for v in cmp[grouping].column("diff_norm").values())
    assert math.isclose(parts, total_sq, rel_tol=1e-3), (p, grouping, parts, total_sq)
  assert 0.0 <= float(cmp["direct"]["share_direct"]) <= 1.0
  assert float(cmp["global"]["diff_norm_intersection"]) <= float(cmp["global"]["diff_norm"]) * (
      1 + 1e-5)
  for layer, d in r["routing"].items():
    same = int(d["n_only_a"]) == 0 and int(d["n_only_b"]) == 0
    cell = cmp["by_module_layer"][f"routed_experts/{layer}"]
    if same:
      assert math.isclose(float(cell["diff_norm"]), float(cell["diff_norm_intersection"]),
                          rel_tol=1e-4), (p, layer)
assert math.isclose(tree_norm(grad_diff), evaluator_norm, rel_tol=1e-3)
assert math.isclose(float(loss_f), float(results[FOCUS]["compare"]["loss"]["loss_fp8"]),
                    rel_tol=1e-5)
for layer, (lhs, rhs) in identity.items():
  assert math.isclose(lhs, rhs, rel_tol=1e-6, abs_tol=1e-30), (layer, lhs, rhs)
print(f"every statement holds; the notebook ran in {NB.elapsed():.0f} s")
