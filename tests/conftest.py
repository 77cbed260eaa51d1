"""Test configuration: CPU JAX, a persistent compilation cache, hypothesis profiles.

``FP8JAX_HYPOTHESIS=thorough`` runs many more examples. In CI (``CI=true``) the
examples are derandomized so that a run is reproducible.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Many tests (and the binaries they start) compile the same tiny-model functions: a
# persistent compilation cache shared by the xdist workers and subprocesses saves minutes.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "default", max_examples=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("CI", "").lower() == "true")
settings.register_profile(
    "thorough", max_examples=1000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("FP8JAX_HYPOTHESIS", "default"))
