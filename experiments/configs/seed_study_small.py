"""The seed study at small scale (docs/validation.md): a 9-layer DeepSeek-MoE trained in BF16
for 3000 steps with 11 checkpoints, for the seed grid's one-step comparison at every one.

    python -m fp8jax.experiments.train_tokenizer --input=synthetic:8 --out=$WORK/tok1k \
        --vocab_size=1024 --sample_mb=8
    python -m fp8jax.experiments.study --config=experiments/configs/seed_study_small.py \
        --config.data.tokenizer=$WORK/tok1k/tokenizer.json --out=$WORK/seed_small \
        --policies=seed --offsets=0,10 --batches=2 --batch_size=16 --branch_k=0

The seed study trained DeepSeek-MoE-2B (9 layers, every one MoE) for 10000 steps, 2000 of
them warm-up, with checkpoints every 500 from step 0. Here the same depth and layout at the
widths of ``validate_small.py`` (hidden 256, 16 routed experts of width 128, top-2, one
shared), 3000 steps of 32 x 256 tokens (24.6M tokens, each seen once:
``synthetic:128`` through the 1024-id BPE), warm-up over the first 20% as in the seed study,
the step decay at 80% and 90%, and checkpoints every 300 steps from step 0 (11 of them).
"""

from fp8jax.train import run_config


def get_config():
  c = run_config.defaults()
  c.model = "tiny"
  c.model_overrides.vocab_size = 1024
  c.model_overrides.hidden_size = 256
  c.model_overrides.num_hidden_layers = 9
  c.model_overrides.num_attention_heads = 4
  c.model_overrides.intermediate_size = 512
  c.model_overrides.moe_intermediate_size = 128
  c.model_overrides.n_routed_experts = 16
  c.model_overrides.num_experts_per_tok = 2
  c.model_overrides.first_k_dense_replace = 0
  c.model_overrides.max_position_embeddings = 256
  c.data.source = "synthetic:128"
  c.data.tokenizer = "bytes"  # set to the BPE's tokenizer.json (see above)
  c.data.seq_len = 256
  c.data.global_batch = 32
  c.optim.peak_lr = 2e-3
  c.optim.warmup_steps = 600
  c.train.steps = 3000
  c.train.save_every = 300
  c.train.log_every = 10
  c.train.scan_layers = True
  c.train.moe_impl = "dispatch"
  return c
