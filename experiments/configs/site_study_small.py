"""The site study at small scale (docs/validation.md): a 9-layer DeepSeek-MoE trained in BF16
for 3000 steps with 11 checkpoints, for the site grid's one-step comparison at every one.

    python -m fp8jax.experiments.train_tokenizer --input=synthetic:8 --out=$WORK/tok1k \
        --vocab_size=1024 --sample_mb=8
    python -m fp8jax.experiments.study --config=experiments/configs/site_study_small.py \
        --config.data.tokenizer=$WORK/tok1k/tokenizer.json --out=$WORK/seed_small \
        --policies=sites --offsets=0,10 --batches=2 --batch_size=16 --branch_k=0

The original study trained DeepSeek-MoE-2B (9 layers, every one MoE) for 10000 steps, 2000 of
them warm-up, with checkpoints every 500 from step 0. Here the same depth and layout at the
widths of ``validate_small.py`` (hidden 256, 16 routed experts of width 128, top-2, one
shared), 3000 steps of 32 x 256 tokens (24.6M tokens, each seen once:
``synthetic:128`` through the 1024-id BPE), warm-up over the first 20% as in the original study,
the step decay at 80% and 90%, and checkpoints every 300 steps from step 0 (11 of them).
"""

from fp8jax.experiments.configs import validate_small


def get_config():
  c = validate_small.get_config()
  c.model_overrides.num_hidden_layers = 9
  c.model_overrides.first_k_dense_replace = 0
  c.data.source = "synthetic:128"
  c.optim.warmup_steps = 600
  c.train.steps = 3000
  c.train.save_every = 300
  c.train.checkpoints = True
  c.train.scan_layers = True
  return c
