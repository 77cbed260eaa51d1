"""A tiny NanoMoE (the ``nano-moe-jax`` package, a Flax Linen sparse-MoE language model
fp8jax did not write; fp8jax.models.thirdparty_nano_moe) on the embedded English corpus:
the study's pipeline on a third-party model, through the model registry.

    pip install 'nano-moe-jax>=0.1,<0.2'          # in the dev extra
    python -m fp8jax.experiments.train --config=experiments/configs/train_nano_moe_tiny.py \
        --workdir=out/nano_moe
    python -m fp8jax.experiments.compare --train_workdir=out/nano_moe \
        --out=out/nano_moe_cmp --policies=gemm:mxfp8,gemm:nvfp4_recipe

2 blocks, hidden 64, 4 heads, 4 experts of width 128 with top-2 routing; 200 steps of
8 x 128 byte tokens with checkpoints at 0, 50, 100, 150, 200. Its policies are rules over
its parameters' module paths (fp8jax.models.rules_policy: ``gemm:RECIPE[@REGEX]``, e.g.
``gemm:mxfp8@block_\\d+/MoELayer_0/.*`` for the router and experts).
"""

from fp8jax.train import run_config


def get_config():
  c = run_config.defaults()
  c.model = "nano_moe:tiny"
  c.data.source = "embedded"
  c.data.seq_len = 128
  c.data.global_batch = 8
  c.optim.peak_lr = 3e-3
  c.optim.warmup_steps = 20
  c.train.steps = 200
  c.train.save_every = 50
  c.train.log_every = 10
  return c
