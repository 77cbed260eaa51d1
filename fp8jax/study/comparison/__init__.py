"""The paired comparison: BF16 and low-precision gradients of the same checkpoints and
batches, policy by policy.

* :mod:`~fp8jax.study.comparison.policies`: policy grids and expressions expanded;
* :mod:`~fp8jax.study.comparison.model_api` and :mod:`~fp8jax.study.comparison.model_sweep`:
  any Flax model as a compared model, and the sweep on it from params in memory;
* :mod:`~fp8jax.study.comparison.paired`: one batch (the BF16 gradient once, one compiled
  function per policy, metrics on device);
* :mod:`~fp8jax.study.comparison.sweep`: the resumable, kill-safe sweep over a checkpoint
  source (:mod:`~fp8jax.study.comparison.checkpoint_source`: a training run's folder or
  params in memory), windows and a policy grid, writing the lines of
  :mod:`~fp8jax.study.comparison.sweep_rows`;
* the analyses of a sweep folder: :mod:`~fp8jax.study.comparison.conditioning`,
  :mod:`~fp8jax.study.comparison.floor`, :mod:`~fp8jax.study.comparison.format_width`,
  :mod:`~fp8jax.study.comparison.questions` and :mod:`~fp8jax.study.comparison.figures`.

Import the modules directly; nothing is imported here.
"""
