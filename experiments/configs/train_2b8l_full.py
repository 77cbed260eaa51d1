"""A full low-precision run at the 2B widths: 8 DeepSeek-MoE-2B layers, 2000 steps on
generated text, one GPU. Train it in BF16 and under the DeepSeek-V3 recipe, then overlay:

    python -m fp8jax.experiments.train --config=experiments/configs/train_2b8l_full.py \
        --workdir=$WORK/full_bf16
    python -m fp8jax.experiments.train --config=experiments/configs/train_2b8l_full.py \
        --workdir=$WORK/full_fp8 --config.policy=gemm:fp32_blockwise
    python -m fp8jax.experiments.compare_runs --runs=$WORK/full_bf16,$WORK/full_fp8 \
        --out=$WORK/full_cmp

The model is the DeepSeekMoE paper's 2B model (hidden 1280, 63 routed experts of width 853
plus one shared, top-7, vocabulary 8192) with 8 of its 9 layers; the byte tokenizer's ids
fit its vocabulary. 8 x 512 tokens per step, 8.2M tokens in all, from 15 MB of generated
text (``synthetic:16``, :mod:`fp8jax.data.synthetic`) that the run never sees twice: the
0.5 MB embedded corpus would be seen 16 times and memorized at this width. AdamW as the
2B baseline with 200 warmup steps and the step decay at 80% and 90%. No checkpoints (two
24 GB saves per run buy nothing here: the runs are for their loss curves,
``metrics.jsonl``, every 20 steps). Measured in docs/full_runs.md.
"""

from fp8jax.train import run_config


def get_config():
  c = run_config.defaults()
  c.model = "deepseek_moe_2b"
  c.model_overrides.num_hidden_layers = 8
  c.model_overrides.expert_pad_to = 896  # exact zero padding for the grouped GEMM kernels
  c.data.source = "synthetic:16"
  c.data.seq_len = 512
  c.data.global_batch = 8
  c.optim.peak_lr = 1.08e-3
  c.optim.warmup_steps = 200
  c.train.steps = 2000
  c.train.save_every = 2000
  c.train.log_every = 20
  c.train.checkpoints = False
  c.train.moe_impl = "pallas"
  return c
