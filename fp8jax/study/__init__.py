"""The studies, as libraries that the binaries and notebooks call, in rooms.

Each room imports only the rooms below it (``tests/project/test_layout.py`` checks it):

* :mod:`fp8jax.study.common` (bottom): results I/O and statistics that every study
  shares: append-only JSONL files (:mod:`~fp8jax.study.common.results_io`), a loaded sweep
  (:mod:`~fp8jax.study.common.results`), intervals and tests
  (:mod:`~fp8jax.study.common.intervals`, :mod:`~fp8jax.study.common.stats`,
  :mod:`~fp8jax.study.common.correlation`) and the noise floor's perturbation
  (:mod:`~fp8jax.study.common.noise_floor`);
* :mod:`fp8jax.study.comparison`: the paired BF16 / low-precision comparison: the policies
  and their grids, the paired evaluator, the resumable sweep, any model's interface, and
  the analyses of a sweep (conditioning, floor, format width, the questions, figures);
* :mod:`fp8jax.study.branches`: the branch-off runs (K more steps under each policy from
  baseline checkpoints) and the trajectory analysis that joins them with a sweep;
* :mod:`fp8jax.study.runs`: full training runs: their overlay and the validation matrix;
* :mod:`fp8jax.study.formats`: the FP8 / MX / NVFP4 numerics study (no model training).

On top, this package holds the comparison study end to end: :mod:`~fp8jax.study.sweep_report`
(``report.md``, with the trajectory section of the branch-off study) and
:mod:`~fp8jax.study.pipeline` (baseline training, sweep, branch-off runs, report).

Import the modules directly; nothing is imported here.
"""
