"""Experiment binaries, installed as ``fp8jax.experiments`` (run with ``python -m``)."""
