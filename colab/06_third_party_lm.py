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
# # The study on a language model from PyPI
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fp8jax/fp8jax/blob/main/colab/06_third_party_lm.ipynb)
#
# NanoMoE, a Flax Linen sparse-MoE language model from the `nano-moe-jax` package, goes
# through the study as the registry's `nano_moe:tiny`, with no edit to its source:
#
# * its **GEMMs**: every matmul on a parameter (attention, router, experts, head) is
#   reached by precision rules on the jaxpr route;
# * **training**: a BF16 baseline on the embedded English corpus, with checkpoints;
# * the paired **comparison**: on each checkpoint, the BF16 gradient against an 8-bit and a
#   4-bit recipe's on the same batches, beside the noise floor, with the routing
#   divergence of its top-2 routers;
# * the **report**: its summary table and the gradient error over the checkpoints.
#
# The same stages as binaries: `--config=experiments/configs/train_nano_moe_tiny.py`
# (docs/models.md). `FP8JAX_SMOKE=1` (what CI runs) trains one block of two experts (top-1)
# for 4 steps and compares two recipes on one batch without the noise floor; without it,
# `nano_moe:tiny` as shipped (two blocks of four experts, top-2), 100 steps and a grid of
# four recipes.

# %%
import importlib
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("fp8jax") is None or importlib.util.find_spec("nano_moe") is None:
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "nano-moe-jax>=0.1,<0.2",
                  "fp8jax @ git+https://github.com/fp8jax/fp8jax"], check=True)
  importlib.invalidate_caches()

# %%
import json
import os
import pathlib
import tempfile

from IPython.display import Image, Markdown, display
import jax

from fp8jax.experiments.configs import train_nano_moe_tiny
from fp8jax.models import registry
from fp8jax.rules import describe
from fp8jax.study import sweep_report
from fp8jax.study.comparison import sweep
from fp8jax.train import loop

SMOKE = os.environ.get("FP8JAX_SMOKE") == "1"
SHAPE = dict(n_layers=1, n_experts=2, top_k=1) if SMOKE else {}
STEPS, SAVE_EVERY, SEQ_LEN, BATCH = (4, 4, 32, 4) if SMOKE else (100, 25, 128, 8)
GRID = (["gemm:mxfp8", "gemm:nvfp4"] if SMOKE else
        ["gemm:fp32_blockwise", "gemm:mxfp8", "gemm:mxfp4", "gemm:nvfp4_recipe"])
WORK = pathlib.Path(tempfile.mkdtemp())

# %% [markdown]
# ## The model and what the rules reach
#
# `registry.get` builds NanoMoE from its own `NanoMoEConfig` at random init (no download).
# Its params stay FP32; the forward computes in BF16, the baseline. `describe` traces the
# forward abstractly and lists every GEMM with what the policy does to it: the attention's
# four-head products have no parameter operand and stay in BF16.

# %%
model = registry.get("nano_moe:tiny", overrides=SHAPE)
params = model.init(jax.random.key(0))
print(f"{model.name} {SHAPE or ''}: {sum(x.size for x in jax.tree.leaves(params)):,} parameters")
policy = model.policy(GRID[-1])
tokens = jax.numpy.zeros((2, 16), jax.numpy.int32)
print(describe(lambda p, t: model.apply(p, t, model.baseline), policy.rules, params, tokens))

# %% [markdown]
# ## A BF16 baseline with checkpoints

# %%
cfg = train_nano_moe_tiny.get_config()
cfg.model_overrides.update(SHAPE)
cfg.train.steps, cfg.train.save_every, cfg.train.log_every = STEPS, SAVE_EVERY, SAVE_EVERY
cfg.data.seq_len, cfg.data.global_batch = SEQ_LEN, BATCH
cfg.optim.warmup_steps = 1 if SMOKE else 20
summary = loop.train(cfg, WORK / "train", stream=sys.stdout)
print(f"final loss {summary['final_loss']:.3f} at step {summary['final_step']}")

# %% [markdown]
# ## BF16 against each recipe on every checkpoint

# %%
windows = sweep.Windows(batches=1 if SMOKE else 2, batch_size=4)
sweep.run(WORK / "train", WORK / "compare", policies=GRID, windows=windows,
          floor=not SMOKE, telemetry=not SMOKE, stream=sys.stdout)
rows = [json.loads(line) for line in (WORK / "compare" / "rows.jsonl").read_text().splitlines()]
for r in rows:
  diverged = [v for k, v in r.items() if k.endswith("topk_set_diff_frac")]
  print(f"step {r['step']:>3}  {r['policy']:<22} rel_err {r['rel_err']:.3g}  "
        f"top-2 sets changed {max(diverged, default=0.0):.1%} of tokens (worst layer)")

# %% [markdown]
# ## The report
#
# `report.md` holds the grid, the conditioning of every checkpoint, the summary per policy
# against the noise floor, where the perturbation sits (module, layer) and how the error
# grows from the 8-bit to the 4-bit recipes; its figures are in `figures/`.

# %%
path = sweep_report.write_report(WORK / "compare")
text = path.read_text()
summary_table = text.split("## Summary per policy", 1)[1].split("\n## ", 1)[0]
display(Markdown("## Summary per policy" + summary_table))
display(Image(filename=str(path.parent / "figures" / "grad_error.png")))
