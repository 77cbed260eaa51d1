"""The embedded-default demo: a tiny 4-layer DeepSeek-MoE on the embedded English corpus.

    python -m fp8jax.experiments.train --config=experiments/configs/train_tiny.py \
        --workdir=out/train

CPU, under a minute on 2 cores: 200 steps of 8 x 128 byte tokens (0.2M tokens), with
checkpoints at 0, 50, 100, 150, 200. Every one of the 4 layers is MoE, so the seed
study's sites (attention or MoE output, layer 0 or all layers) all exist. The MoE runs
every expert on every token (``moe_impl="reference"``, exact and quick to compile at
this size; the sorted dispatch is for real sizes).
"""

from ml_collections import config_dict

from fp8jax.train import run_config


def get_config():
  c = run_config.defaults()
  c.model = "tiny"
  c.model_overrides.num_hidden_layers = 4
  c.model_overrides.first_k_dense_replace = 0
  c.model_overrides.swiglu_limit = config_dict.placeholder(float)  # DeepSeek-V4's SwiGLU
  # clamp on the command line (--config.model_overrides.swiglu_limit=10); None: off
  c.data.source = "embedded"
  c.data.seq_len = 128
  c.data.global_batch = 8
  c.optim.peak_lr = 3e-3
  c.optim.warmup_steps = 20
  c.train.steps = 200
  c.train.save_every = 50
  c.train.log_every = 10
  c.train.moe_impl = "reference"
  return c
