"""DeepSeek-MoE-16B (public config) on C4 with params and optimizer state sharded (FSDP).

    python -m fp8jax.experiments.train --config=experiments/configs/train_16b_c4.py \
        --workdir=$WORK/ds16b_bf16 --config.data.data_dir=$TFDS_DATA_DIR \
        --config.data.tokenizer=$DEEPSEEK_16B_DIR/tokenizer.json

16.4B float32 params plus two AdamW moments are ~197 GB: ``train.fsdp`` splits them over
the ``data`` axis, and each device gathers a layer's weights where it runs and gets its
part of the gradient by a reduce-scatter (``data_parallel.gather_in_forward``). The scan
is rolled and each layer recomputed in the backward pass, so that one layer's gathered
weights are whole at a time: on 4 x H200 this step fits 2 x 4096 tokens per device (the
default global batch of 8); 4 x 4096 does not fit, nor does the 16B state on 2 GPUs (its
step time and memory: docs/performance.md). The tokenizer is the public model's
(vocabulary 102400).

Beyond one host (README, Several hosts), every process runs the same command with
``--distributed``, and the global batch must split over all devices (one sequence per
device: ``--config.data.global_batch=16`` on 2 x 8 GPUs)::

    # SLURM, one process per GPU (sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8)
    srun python -m fp8jax.experiments.train --distributed \
        --config=experiments/configs/train_16b_c4.py --config.data.global_batch=16 ...
    # one machine, 2 processes of 4 GPUs each (a rehearsal of the multi-host run)
    python scripts/launch_local.py --processes=2 --gpus_per_process=4 -- \
        python -m fp8jax.experiments.train --distributed \
        --config=experiments/configs/train_16b_c4.py ...
    # GKE GPU pods: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID in the pod
    # spec, then the SLURM command without srun; Cloud TPU: plain --distributed

A SIGTERM saves a checkpoint at the next step on every process and exits with 75;
``--resume`` continues exactly.
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
  c.train.scan_layers = True  # the 27 alike MoE layers traced once
  c.train.scan_unroll = 1  # rolled: each layer's weights gathered in its own iteration
  c.train.scan_remat = "nothing_saveable"  # and again in the backward pass
  return c
