"""Model definitions, installed as ``fp8jax.models``."""
