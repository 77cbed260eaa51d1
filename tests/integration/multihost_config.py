"""The run config of tests/integration/test_multihost.py: the demo's tiny model at 1 layer, float32
(for the 1-vs-N-device tolerance), 8 x 32 tokens per step, a checkpoint every 2 steps and
a learning rate that does not depend on ``train.steps`` (so runs of different lengths
share their first steps). ``--config=tests/integration/multihost_config.py:fsdp`` widens
the model to 256 so that FSDP splits its largest arrays (embeddings, 320 x 256) over the devices."""

from fp8jax.experiments.configs import train_tiny


def get_config(variant: str = ""):
  if variant not in ("", "fsdp"):
    raise ValueError(f"unknown variant {variant!r} of tests/integration/multihost_config.py")
  c = train_tiny.get_config()
  c.model_overrides.num_hidden_layers = 1
  c.model_overrides.dtype = "float32"
  c.data.seq_len, c.data.global_batch = 32, 8
  c.train.save_every, c.train.log_every = 2, 1
  c.optim.warmup_steps, c.optim.total_steps, c.optim.decay_at = 1, 1000, ()
  if variant == "fsdp":
    c.model_overrides.hidden_size, c.train.fsdp = 256, True
  return c
