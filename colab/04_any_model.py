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
# # The precision study on a model fp8jax did not write
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fp8jax/fp8jax/blob/main/colab/04_any_model.ipynb)
#
# CanViT, a Flax NNX vision transformer from the `canvit-nnx` package, randomly
# initialised, goes through the same study as fp8jax's DeepSeek-MoE, with no edit to its
# source:
#
# * precision **rules** over its module paths: a seed-style grid, {attention, MLP} output x
#   {block 0, every block} x {E4M3, E5M2}, activations only (per-tensor current scaling);
# * the paired **sweep**: the BF16 gradient once per batch, then each variant's, compared
#   on the same params and batches, plus the noise floor;
# * the **report**, written as for DeepSeek-MoE (no routing or expert metrics: CanViT has no
#   experts).
#
# `FP8JAX_SMOKE=1` (what CI runs) uses a 2-block backbone, two small batches and the grid's
# E4M3 half; without it, a 4-block backbone, more batches and both formats.

# %%
import importlib
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("fp8jax") is None or importlib.util.find_spec("canvit_nnx") is None:
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "canvit-nnx>=0.2,<0.3",
                  "fp8jax @ git+https://github.com/fp8jax/fp8jax"], check=True)
  importlib.invalidate_caches()

# %%
import os
import pathlib
import tempfile

from canvit_core import backbone
import canvit_nnx
from flax import nnx
import jax

from fp8jax.metrics.paths import Classifier
from fp8jax.models import policy
from fp8jax.rules import Rule, Rules, describe, quantize_model
from fp8jax.study import sweep_report
from fp8jax.study.comparison import model_api, model_sweep

SMOKE = os.environ.get("FP8JAX_SMOKE") == "1"
BLOCKS, DIM, BATCHES = (2, 32, 2) if SMOKE else (4, 64, 4)
FORMATS = ("e4m3",) if SMOKE else ("e4m3", "e5m2")

# %% [markdown]
# ## The model
#
# CanViT reads its backbone by name from the package's table `BACKBONES`; its smallest
# shipped one has 22M parameters, so a small one is registered there. `call` is the only
# glue: the model takes a glimpse, a recurrent state and a viewpoint, and the study a batch
# of images with labels (loss: `model_api.label_loss`, cross-entropy on the labels).

# %%
backbone.BACKBONES["study_small"] = backbone.ViTSpec(embed_dim=DIM, num_heads=2,
                                                     num_blocks=BLOCKS, patch_size=8)
config = canvit_nnx.CanViTConfig(backbone_name="study_small", canvas_num_heads=2,
                                 canvas_head_dim=8, num_canvas_registers=2,
                                 num_backbone_registers=1)
net = canvit_nnx.CanViTForImageClassification(canvit_config=config, n_classes=10,
                                              rngs=nnx.Rngs(0))


def call(module, batch):
  b = batch["images"].shape[0]
  state = module.init_state(batch_size=b, canvas_grid_size=2)
  return module(glimpse=batch["images"], state=state,
                viewpoint=canvit_nnx.Viewpoint.full_scene(batch_size=b))[0]



groups = Classifier.from_patterns({"attn": "/attn/", "mlp": "/mlp/", "readout": "^readout/"},
                                  layer=r"^canvit/backbone/blocks/(\d+)/")
model, params = model_api.nnx_model(net, groups, name="canvit", call=call,
                                     loss=model_api.label_loss)
print(f"{sum(x.size for x in jax.tree.leaves(params)):,} parameters")

# %% [markdown]
# ## The rules: a seed-style grid
#
# Each variant fake-quantizes the output of the attention or the MLP of block 0 or of every
# block, forward and backward (the cotangent there), in E4M3 or E5M2, as the site grid
# does at DeepSeek-MoE's `attn_out` and `moe_out` sites. `describe` shows what each rule
# reaches.

# %%
variants = []
for module in ("attn", "mlp"):
  for depth, layers in (("l0", "0"), (f"l0-{BLOCKS - 1}", r"\d+")):
    for fmt in FORMATS:
      rules = Rules([Rule(rf"canvit/backbone/blocks/{layers}/{module}",
                          policy.parse_spec(fmt), role="output")])
      variants.append(model_api.Variant(f"{module}_{depth}_{fmt}", rules,
                                        f"blocks/{depth[1:]}/{module}: {fmt} output"))
print(describe(quantize_model(net, variants[2].rules), variants[2].rules))

# %% [markdown]
# ## The sweep and the report

# %%
key = jax.random.key(1)
batches = [{"images": jax.random.normal(jax.random.fold_in(key, i), (4, 16, 16, 3)),
            "labels": jax.random.randint(jax.random.fold_in(key, 100 + i), (4,), 0, 10)}
           for i in range(BATCHES)]
out = pathlib.Path(tempfile.mkdtemp()) / "compare"
model_sweep.evaluate(model, out, variants, params, batches)
path = sweep_report.write_report(out)
text = path.read_text()
print(text[:text.index("## Answers")] if "## Answers" in text else text[:4000])
