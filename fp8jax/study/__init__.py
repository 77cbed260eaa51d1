"""The studies, as libraries that the binaries and notebooks call.

The precision comparison study, bottom to top:

* :mod:`~fp8jax.study.paired`: BF16 and low-precision gradients of one checkpoint and batch
  (the BF16 gradient once, one compiled function per policy, metrics on device);
* :mod:`~fp8jax.study.sweep`: the resumable, kill-safe sweep over checkpoints, windows and a
  policy grid (``rows.jsonl``, ``details.jsonl``, ...), written through
  :mod:`~fp8jax.study.results_io`;
* :mod:`~fp8jax.study.results` (a sweep folder loaded), :mod:`~fp8jax.study.intervals` and
  :mod:`~fp8jax.study.stats` (intervals per checkpoint, medians over checkpoints with
  bootstrap intervals, paired ratios, trajectories), :mod:`~fp8jax.study.conditioning`
  (conditioning per checkpoint, spike flags), :mod:`~fp8jax.study.floor` (policies against
  the noise floor and noise-matched controls), :mod:`~fp8jax.study.questions` (the study's
  answers), :mod:`~fp8jax.study.figures`, and :mod:`~fp8jax.study.report` (``report.md``);
* :mod:`~fp8jax.study.pipeline`: baseline training, sweep and report end to end.

The numerics study: :mod:`~fp8jax.study.numerics_study` (the measurements) and
:mod:`~fp8jax.study.numerics_report` (JSON, figures, ``report.md``).

Import the modules directly; nothing is imported here.
"""
