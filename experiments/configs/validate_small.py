"""The validation matrix's runs (docs/validation.md): a small DeepSeek-MoE that one GPU
trains in under a minute per run, several processes sharing the GPU (their wall times:
docs/validation.md).

    python -m fp8jax.experiments.train_tokenizer --input=synthetic:8 --out=$WORK/tok1k \
        --vocab_size=1024 --sample_mb=8
    python -m fp8jax.experiments.validate --config=experiments/configs/validate_small.py \
        --config.data.tokenizer=$WORK/tok1k/tokenizer.json --out=$WORK/validation \
        --recipes=bf16,gemm:fp32_blockwise,gemm:mxfp8,gemm:mxfp4,gemm:nvfp4 --seeds=0-2

4 layers (the first dense, 3 MoE with 16 routed experts of width 128, top-2, one shared),
hidden 256: every width a multiple of 128, so each recipe's blocks (128x128 weights,
1x128 activations, MX 32, NVFP4 16 and 16x16) tile it exactly. Text: ``synthetic:32``
(:mod:`fp8jax.data.synthetic`) through a 1024-id byte-level BPE trained on the same
generator, 32 x 256 tokens per step, 800 steps (6.6M tokens, each seen once); the
corpus's entropy rate gives the best achievable loss (about 1.57 nats per token with this
tokenizer). No checkpoints: a run is its ``metrics.jsonl``. The default (non-deterministic)
GPU mode: the seed-to-seed spread is the yardstick, and it includes the run-to-run noise.
"""

from ml_collections import config_dict

from fp8jax.train import run_config


def get_config():
  c = run_config.defaults()
  c.model = "tiny"
  c.model_overrides.vocab_size = 1024
  c.model_overrides.hidden_size = 256
  c.model_overrides.num_hidden_layers = 4
  c.model_overrides.num_attention_heads = 4
  c.model_overrides.intermediate_size = 512
  c.model_overrides.moe_intermediate_size = 128
  c.model_overrides.n_routed_experts = 16
  c.model_overrides.num_experts_per_tok = 2
  c.model_overrides.first_k_dense_replace = 1
  c.model_overrides.max_position_embeddings = 256
  c.model_overrides.swiglu_limit = config_dict.placeholder(float)  # DeepSeek-V4's SwiGLU
  # clamp on the command line (--config.model_overrides.swiglu_limit=10); None: off
  c.data.source = "synthetic:32"
  c.data.tokenizer = "bytes"  # set to the BPE's tokenizer.json (see above)
  c.data.seq_len = 256
  c.data.global_batch = 32
  c.optim.peak_lr = 2e-3
  c.optim.warmup_steps = 80
  c.train.steps = 800
  c.train.save_every = 800
  c.train.log_every = 10
  c.train.checkpoints = False
  c.train.moe_impl = "dispatch"
  return c
