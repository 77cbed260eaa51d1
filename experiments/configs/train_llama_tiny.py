"""A tiny Llama-style dense model (fp8jax.models.llama) on the embedded English corpus:
the study's pipeline on a model that is not DeepSeek-MoE, through the model registry.

    python -m fp8jax.experiments.train --config=experiments/configs/train_llama_tiny.py \
        --workdir=out/llama
    python -m fp8jax.experiments.train --config=experiments/configs/train_llama_tiny.py \
        --workdir=out/llama_fp8 --config.policy=gemm:fp32_blockwise

2 layers, hidden 64, grouped-query attention; 200 steps of 8 x 128 byte tokens with
checkpoints at 0, 50, 100, 150, 200. Its policies are rules over its module paths
(fp8jax.models.rules_policy: ``gemm:RECIPE[@REGEX]``, ``output:SPEC@REGEX``, ...).
"""

from ml_collections import config_dict

from fp8jax.train import run_config


def get_config():
  c = run_config.defaults()
  c.model = "llama:tiny"
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
  return c
