"""DeepSeek-MoE-16B (public config) on C4 with params and optimizer state sharded (FSDP).

    python -m fp8jax.experiments.train --config=experiments/configs/train_16b_c4.py \
        --workdir=$WORK/ds16b_bf16 --config.data.data_dir=$TFDS_DATA_DIR \
        --config.data.tokenizer=$DEEPSEEK_16B_DIR/tokenizer.json

16.4B float32 params plus two AdamW moments are ~197 GB: ``train.fsdp`` splits them over
the ``data`` axis (8 x H200 should hold them with activations at batch 1 x 4096 per
device; not measured). The tokenizer is the public model's (vocabulary 102400).
"""

from fp8jax.train import run_config


def get_config():
  c = run_config.defaults()
  c.model = "deepseek_moe_16b"
  c.data.source = "tfds:c4/en:3.1.0"
  c.data.seq_len = 4096
  c.data.global_batch = 8
  c.optim.peak_lr = 4.2e-4
  c.optim.warmup_steps = 2000
  c.optim.total_steps = 10000
  c.train.steps = 10000
  c.train.save_every = 500
  c.train.fsdp = True
  return c
