"""The branch-off study: from baseline checkpoints, K more training steps under BF16, a
noise floor and each policy (:mod:`~fp8jax.study.branches.branch`,
:mod:`~fp8jax.study.branches.branch_metrics`), and whether a sweep's one-step perturbation
predicts the trajectory (:mod:`~fp8jax.study.branches.trajectory`,
:mod:`~fp8jax.study.branches.trajectory_figures`).

Import the modules directly; nothing is imported here.
"""
