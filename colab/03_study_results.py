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
# # Exploring a study's results
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fp8jax/fp8jax/blob/main/colab/03_study_results.ipynb)
#
# The precision study compares BF16 and FP8 gradients of a DeepSeek-MoE model at every saved
# checkpoint of a training run, on the same evaluation batches, for a grid of FP8 precision
# policies. `python -m fp8jax.experiments.study` does it end to end (train a baseline, run the
# comparison sweep, write `report.md`); this notebook opens the results of such a study and
# explores them:
#
# * the sweep's grid, the conditioning of every checkpoint and the summary of every policy,
#   with 95% intervals over the evaluation batches;
# * every policy against the noise floor (how many times the checkpoint's own sensitivity to
#   a BF16-sized perturbation it is) and, where the sweep has them, against noise-matched
#   controls;
# * the answers to the study's five questions (module, depth, format, redistribution and,
#   for the `formats` grid, format width);
# * interactive plots of one policy, metric and checkpoint at a time: a metric over the
#   checkpoints, the FP8 loss against the BF16 loss, the module x layer heatmap of the gradient
#   difference and the routing divergence of every MoE layer.
#
# Point `RESULTS_DIR` at an existing study to explore it. Left at `None`, the notebook first
# runs a small demo study of its own (the tiny model trained on the embedded English corpus)
# in a temporary folder. Every number is computed when the notebook runs. Set
# `FP8JAX_SMOKE=1` for a smaller demo study that runs in about a minute on one CPU core (CI
# runs it that way); the full demo takes several minutes on a CPU.

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
import math
import pathlib
import tempfile

from matplotlib import colors
import matplotlib.pyplot as plt
import numpy as np

from fp8jax.experiments.configs import train_tiny
from fp8jax.study import notebook, sweep_report
from fp8jax.study.common import results, stats
from fp8jax.study.comparison import conditioning, figures, floor, questions, sweep
from fp8jax.study.notebook import show_markdown
from fp8jax.train import loop

try:
  import ipywidgets as widgets
except ImportError:
  widgets = None

NB = notebook.start()  # versions, devices, and the size: FP8JAX_SMOKE=1 is CI's small one

# %% [markdown]
# ## 1. The results
#
# `RESULTS_DIR` is either the output folder of `python -m fp8jax.experiments.study --out=...`
# (which holds `train/` and `compare/`) or a sweep folder itself (`meta.json`, `rows.jsonl`,
# `details.jsonl`, `baseline.jsonl`, `weights.jsonl`, as written by
# `fp8jax.study.comparison.sweep.run`).
#
# With `RESULTS_DIR = None` the cell runs a demo study through the three stages of
# `fp8jax.study.pipeline.run_study`, the function behind that command: `loop.train` trains
# the tiny demo model (`experiments/configs/train_tiny.py`: every layer MoE, byte tokens) and
# saves checkpoints on the way, `sweep.run` compares the policies on every checkpoint and
# `sweep_report.write_report` writes `report.md` with its figures, all in a temporary folder that is
# removed when the kernel stops. The full demo compares the whole site grid (attention or MoE
# output x first or every layer x E4M3 or E5M2) on two evaluation windows; the smoke version
# trains a shallower model for fewer steps and compares an attention and a MoE policy of the
# same depth and format on one small window, so there the depth and format questions have
# nothing to compare.

# %%
RESULTS_DIR = None   # e.g. "out/demo" or "out/demo/compare"

if RESULTS_DIR is None:
  train_cfg = train_tiny.get_config()
  if NB.smoke:
    train_cfg.model_overrides.num_hidden_layers = 2
    train_cfg.data.seq_len, train_cfg.data.global_batch = 64, 4
    train_cfg.train.steps, train_cfg.train.save_every, train_cfg.train.log_every = 20, 10, 10
    train_cfg.optim.warmup_steps = 5
    POLICIES = ["attn_l0_e4m3", "moe_l0_e4m3"]
    WINDOWS = sweep.Windows(offsets=(0,), batches=2, batch_size=4)
  else:
    POLICIES = ["sites"]
    WINDOWS = sweep.Windows(offsets=(0, 10), batches=2, batch_size=8)
  TMP = tempfile.TemporaryDirectory(prefix="fp8jax_study_")  # removed at kernel exit
  study_dir = pathlib.Path(TMP.name)
  sweep_dir = study_dir / "compare"
  loop.train(train_cfg, study_dir / "train", stream=sys.stdout)
  sweep.run(study_dir / "train", sweep_dir, policies=POLICIES, windows=WINDOWS,
            moe_impl=train_cfg.train.moe_impl, stream=sys.stdout)
  print("report:", sweep_report.write_report(sweep_dir))
else:
  folder = pathlib.Path(RESULTS_DIR)
  sweep_dir = folder / "compare" if (folder / "compare" / "meta.json").exists() else folder

res = results.load(sweep_dir)
print(f"sweep {sweep_dir}: {len(res.policies)} policies, checkpoints {res.steps}, "
      f"{len(res.rows)} rows ({len(res.nonfinite())} non-finite)")

# %% [markdown]
# ## 2. Grid and summary
#
# `results.load` reads the sweep into a `Results` object (`fp8jax.study.common.results`);
# `sweep_report.grid_markdown` and `sweep_report.summary_markdown` are the first sections of
# `report.md`:
# the model, the checkpoints, the evaluation windows, the policies with their directly
# quantized modules (and the noise floor and controls, when the sweep has them), the rows that
# were not finite (excluded from every statistic), and per policy each metric's median over
# the checkpoints with a 95% bootstrap interval (resampling the batches within each
# checkpoint), followed by the relative gradient error per checkpoint. Positive metrics are
# summarized on the log scale: per checkpoint the geometric mean over the batches with the
# t-interval of the logs, so no interval of a norm goes below zero.
#
# The metrics: `rel_err` = ‖g_fp8 − g_bf16‖ / ‖g_bf16‖, `diff_norm` = ‖g_fp8 − g_bf16‖,
# `cosine` between the two gradients, `loss_rel_err` = |loss_fp8 − loss_bf16| / loss_bf16,
# and `share_direct`, the part of ‖g_fp8 − g_bf16‖² that lies in the modules the policy
# quantizes directly.

# %%
show_markdown(sweep_report.grid_markdown(res)[2:] + sweep_report.summary_markdown(res))

# %% [markdown]
# `stats.summary(res, metric)` (`fp8jax.study.common.stats`) gives the same statistics as data,
# `{(policy, step): Stat}` with the center (the geometric mean for rel_err), the interval and
# the number of batches, e.g. for the last checkpoint:

# %%
last = res.steps[-1]
for (p, s), st in stats.summary(res, "rel_err").items():
  if s == last:
    print(f"{p:16s} step {s}: rel_err {stats.fmt_stat(st)}")

# %% [markdown]
# ### The noise floor and the conditioning of each checkpoint
#
# A sweep written with a noise floor also compares BF16 with BF16 at weights perturbed at
# BF16 rounding level, on the same batches: the checkpoint's own sensitivity to any
# perturbation of that size. `conditioning.markdown` shows it per checkpoint with the BF16
# loss and gradient norm and flags the checkpoints in spikes (a signal above 3x its median
# over the checkpoints); `floor.floor_markdown` divides every policy's error by the floor's
# on the same batch and says which policies are within 3x of it ("cannot tell from the
# checkpoint's own sensitivity"); `floor.controls_markdown` compares each policy with its
# noise-matched control `noise(POLICY)` when the sweep has one. A sweep without a floor says
# so.

# %%
show_markdown(conditioning.markdown(res) + floor.floor_markdown(res)
              + floor.controls_markdown(res))
flagged = conditioning.flags(res)
print("flagged checkpoints:", flagged or "none")
if res.floor:
  for p in res.policies:
    print(floor.multiples(res, p)["sentence"])

# %% [markdown]
# ## 3. The five questions
#
# `questions.answers(res)` (`fp8jax.study.comparison.questions`) answers the study's
# questions from the rows:
#
# 1. **module**: attention vs MoE output at the same depth and format, and the shape of each
#    trajectory over the checkpoints (decaying, persistent or growing);
# 2. **depth**: the first layer only vs every layer, per module and format;
# 3. **format**: E4M3 vs E5M2, per module and depth;
# 4. **redistribution**: how the parameters with the largest gradient difference move across
#    the checkpoints, and how much of the difference stays in the directly quantized modules;
# 5. **narrowing**: how each module's gradient error grows from the 8-bit (FP8, MXFP8) to the
#    4-bit (MXFP4, NVFP4) GEMM recipes of the `formats` grid.
#
# A question whose policies are missing from the grid says so. Each answer is a dict of
# numbers with a `summary` sentence built from them; `questions.markdown` renders them as in
# `report.md`.

# %%
answers = questions.answers(res)
for key, answer in answers.items():
  print(f"{key}: {answer['summary']}\n")

# %%
show_markdown(questions.markdown(answers))

# %% [markdown]
# ## 4. Interactive plots
#
# One policy, one metric and one checkpoint at a time, from the rows and details of the
# sweep:
#
# * **top left**: the metric's mean over the evaluation batches at every checkpoint, with its
#   95% interval as a band, for the chosen policy (the others in grey);
# * **top right**: the FP8 loss against the BF16 loss, one point per (checkpoint, batch) row,
#   drawn as the difference loss_fp8 − loss_bf16 against loss_bf16 (the chosen checkpoint's
#   rows ringed);
# * **bottom left**: the gradient difference norm of every module x layer cell at the chosen
#   checkpoint (mean over the batches, logarithmic colours);
# * **bottom right**: the fraction of tokens whose top-k expert set differs between BF16 and
#   FP8, per MoE layer over the checkpoints (mean and 95% interval, clipped to [0, 1]).
#
# With `ipywidgets` installed (as in Colab) the dropdowns and the slider redraw the figure;
# without it the figure is drawn once per policy, for `rel_err` at the last checkpoint. The
# metric menu lists the global metrics and the relative error of each module and layer.

# %%
GLOBAL_METRICS = ("rel_err", "diff_norm", "cosine", "loss_rel_err", "loss_abs_err",
                  "share_direct", "rel_err_intersection", "diff_norm_intersection")
present = {k for r in res.rows for k in r}
METRICS = [m for m in GLOBAL_METRICS if m in present] + sorted(
    k for k in present if k.startswith(("module/", "layer/")) and k.endswith("/rel_err"))
ROUTING_LAYERS = figures.routing_layers(res)


def plot_policy(policy, metric="rel_err", step=None):
  """The four panels of one policy, metric and checkpoint."""
  step = res.steps[-1] if step is None else step
  fig, axes = plt.subplots(2, 2, figsize=(12, 8))

  ax = axes[0, 0]
  for p in res.policies:
    x, mean, lo, hi = figures.series(res, metric, p)
    if p == policy:
      line, = ax.plot(x, mean, marker="o", lw=2, label=p)
      ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.25, lw=0)
    else:
      ax.plot(x, mean, color="grey", lw=0.8, alpha=0.6)
  ax.axvline(step, color="k", ls=":")
  shown = np.concatenate([figures.series(res, metric, p)[1] for p in res.policies]
                         + [figures.series(res, metric, policy)[2]])
  shown = shown[np.isfinite(shown)]
  if shown.size and (shown > 0).all():  # log scale when every mean and lower bound is > 0
    ax.set_yscale("log")
  ax.set(xlabel="checkpoint step", ylabel=metric, title=f"{metric} (mean, 95% CI)")
  ax.legend(fontsize=8)

  ax = axes[0, 1]
  rows = [r for r in res.rows_of(policy) if r["finite"]]
  loss_b = np.array([r["loss_bf16"] for r in rows])
  delta = np.array([r["loss_fp8"] - r["loss_bf16"] for r in rows])
  steps = np.array([r["step"] for r in rows])
  sc = ax.scatter(loss_b, delta, c=steps, cmap="viridis", s=18)
  here = steps == step
  ax.scatter(loss_b[here], delta[here], s=80, facecolors="none", edgecolors="red",
             label=f"step {step}")
  ax.axhline(0.0, color="grey", lw=0.8)
  ax.set(xlabel="loss_bf16 (nats/token)", ylabel="loss_fp8 − loss_bf16",
         title="FP8 vs BF16 loss, per row")
  ax.legend(fontsize=8)
  fig.colorbar(sc, ax=ax, label="checkpoint step")

  ax = axes[1, 0]
  modules, layers, table = figures.module_layer_table(res, policy, step)
  ok = table[np.isfinite(table) & (table > 0)]
  if ok.size:
    im = ax.imshow(np.ma.masked_invalid(table), aspect="auto", cmap="viridis",
                   norm=colors.LogNorm(ok.min(), ok.max()))
    for m, layer in res.direct(policy):
      cols = range(len(layers)) if layer is None else (
          [layers.index(layer)] if layer in layers else [])
      for c in cols:
        if m in modules:
          ax.add_patch(plt.Rectangle((c - 0.5, modules.index(m) - 0.5), 1, 1, fill=False,
                                     edgecolor="red", lw=2))
    ax.set_yticks(range(len(modules)), modules, fontsize=8)
    ax.set_xticks(range(len(layers)), [str(x) for x in layers])
    fig.colorbar(im, ax=ax, label="‖g_fp8 − g_bf16‖")
  else:
    ax.text(0.5, 0.5, "no details at this checkpoint", ha="center", transform=ax.transAxes)
  ax.set(xlabel="layer", title=f"module x layer at step {step} (red: directly quantized)")

  ax = axes[1, 1]
  for layer in ROUTING_LAYERS:
    x, mean, lo, hi = figures.series(res, f"routing/{layer}/topk_set_diff_frac", policy)
    line, = ax.plot(x, mean, marker="o", ms=3, label=f"layer {layer}")
    ax.fill_between(x, np.clip(lo, 0, 1), np.clip(hi, 0, 1), color=line.get_color(),
                    alpha=0.15, lw=0)
  ax.axvline(step, color="k", ls=":")
  ax.set(xlabel="checkpoint step", ylabel="fraction of tokens",
         title="routing: top-k expert set differs")
  if ROUTING_LAYERS:
    ax.legend(fontsize=7, ncol=2)
  fig.suptitle(policy)
  fig.tight_layout()
  plt.show()


if widgets is not None and NB.interactive:
  widgets.interact(
      plot_policy,
      policy=widgets.Dropdown(options=res.policies, description="policy"),
      metric=widgets.Dropdown(options=METRICS, value="rel_err", description="metric"),
      step=widgets.SelectionSlider(options=res.steps, value=res.steps[-1],
                                   description="checkpoint"))
else:
  for p in res.policies:
    plot_policy(p, "rel_err", res.steps[-1])

# %% [markdown]
# ## 5. Further
#
# `sweep_report.write_report(folder)` writes `report.md` and its figures into a sweep folder (the
# demo study above already did); `fp8jax.study.comparison.figures` draws each figure of the report
# separately, and `stats.compare(res, a, b, metric)` compares any two policies on the batches
# they share: the paired ratio a / b per batch, its geometric mean per checkpoint and the
# median over the checkpoints with a bootstrap interval.

# %%
if len(res.policies) >= 2:
  a, b = res.policies[:2]
  c = stats.compare(res, a, b, "rel_err")
  print(f"{a} vs {b}: median rel_err {stats.fmt_stat(c['summary_a'])} vs "
        f"{stats.fmt_stat(c['summary_b'])}, paired ratio {stats.fmt_stat(c['paired'])}")
  for s in c["per_step"]:
    print(f"  step {s['step']}: {stats.fmt(s['a'].mean)} vs {stats.fmt(s['b'].mean)}, "
          f"ratio {stats.fmt_stat(s['paired'], n=False)}")

# %% [markdown]
# ## Checks
#
# Consistency of what was shown, checked on this study's numbers.

# %%
windows = res.meta["windows"]
per_step = len(windows["offsets"]) * windows["batches"]
for p in res.policies:
  for s in res.steps:
    rows = res.rows_of(p, [s])
    st = stats.stat(res, "rel_err", p, [s])
    assert len(rows) <= per_step, (p, s)
    assert st.n + st.n_nonfinite + st.n_undefined == len(rows), (p, s, st)
    if st.has_ci:
      assert 0 <= st.lo <= st.mean <= st.hi, (p, s, st)  # rel_err: never below 0
  if res.details_of(p, res.steps[-1]):
    modules, layers, table = figures.module_layer_table(res, p, res.steps[-1])
    assert table.shape == (len(modules), len(layers)) and np.isfinite(table).any(), p
for r in res.rows:
  if r["finite"]:
    assert math.isclose(r["loss_abs_err"], abs(r["loss_fp8"] - r["loss_bf16"]),
                        rel_tol=1e-4, abs_tol=1e-7), r
assert set(answers) == {"module", "depth", "format", "redistribution", "narrowing"}
assert res.floor not in res.policies and not set(res.controls) & set(res.policies)
if res.floor:
  for p in res.policies:
    m = floor.multiples(res, p)
    assert m["available"] and m["overall"].median > 0, p
if RESULTS_DIR is None:
  compared = len(res.policies) + bool(res.floor) + len(res.controls)  # policies, floor
  assert len(res.rows) == len(res.steps) * per_step * compared
  assert answers["module"]["available"]
print(f"every statement holds; the notebook ran in {NB.elapsed():.0f} s")
