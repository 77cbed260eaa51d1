"""The original study's baseline: DeepSeek-MoE-2B, BF16, C4 English, 4 GPUs, data parallel.

    python -m fp8jax.experiments.train --config=experiments/configs/train_2b_c4.py \
        --workdir=$WORK/ds2b_bf16 --config.data.source=prepared \
        --config.data.data_dir=$WORK/c4_8k --config.data.tokenizer=$WORK/tok8k/tokenizer.json

Needs the ``data`` extra and a tokenizer whose vocabulary fits the model's 8192 ids (the
paper's 2B model uses an 8K BPE vocabulary: ``python -m
fp8jax.experiments.train_tokenizer --vocab_size=8192``). C4 is read in any of the forms
of docs/study_2b.md: a folder that ``prepare_data`` tokenized once
(``source=prepared``, as above), the allenai/c4 ``json.gz`` shards streamed directly
(``--config.data.source=files --config.data.paths='/data/c4/en/c4-train.*.json.gz'``),
the prepared tfds C4 in TFRecord (``--config.data.source=tfds:c4/en:3.0.1``, needs the
``tf`` extra) or in ArrayRecord (the default source below, with
``--config.data.data_dir=$TFDS_DATA_DIR``).

Recipe (DeepSeekMoE paper, section 4.1, and the original study): AdamW (0.9, 0.95), weight
decay 0.1, clip 1.0, peak LR 1.08e-3 with 2000 warmup steps and x0.316 at 80% and 90%
of the schedule, sequences of 2048 tokens. The original study trained to step 10000 with a
batch the 4 GPUs hold and kept checkpoints every 500 steps from step 0. Here 16 x 2048
tokens per step: 4 sequences per device (an H100 holds 8 with the Pallas grouped GEMM,
``moe_impl="pallas"``, used here; docs/performance.md). BF16 compute, FP32 master weights
and optimizer state.
"""

from fp8jax.train import run_config


def get_config():
  c = run_config.defaults()
  c.model = "deepseek_moe_2b"
  # Expert width 853 stored zero-padded to 896 (exact): the Mosaic GPU grouped GEMMs need
  # a multiple of 128.
  c.model_overrides.expert_pad_to = 896
  c.data.source = "tfds:c4/en:3.1.0"
  c.data.seq_len = 2048
  c.data.global_batch = 16
  c.optim.peak_lr = 1.08e-3
  c.optim.warmup_steps = 2000
  c.optim.total_steps = 10000
  c.train.steps = 10000
  c.train.save_every = 500
  c.train.log_every = 10
  # Alike layers traced once (the layer loop took minutes to compile on several GPUs).
  c.train.scan_layers = True
  c.train.moe_impl = "pallas"  # the grouped-GEMM kernel (GPU); "dispatch" for XLA's
  return c
