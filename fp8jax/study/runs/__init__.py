"""Full training runs compared: the overlay of several runs
(:mod:`~fp8jax.study.runs.overlay`) and the validation matrix of recipes x seeds
(:mod:`~fp8jax.study.runs.validation`).

Import the modules directly; nothing is imported here.
"""
