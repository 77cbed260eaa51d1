"""Test configuration: CPU JAX, a persistent compilation cache, hypothesis profiles.

``FP8JAX_HYPOTHESIS=thorough`` runs many more examples, and the tests marked
``thorough`` (many-example repeats of property tests that also run at default size),
which the default suite leaves out. In CI (``CI=true``) the examples are derandomized so
that a run is reproducible.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Many tests (and the binaries they start) compile the same tiny-model functions: a
# persistent compilation cache shared by the xdist workers and subprocesses saves minutes.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

from hypothesis import HealthCheck, settings  # noqa: E402
import pytest  # noqa: E402

settings.register_profile(
    "default", max_examples=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("CI", "").lower() == "true")
settings.register_profile(
    "thorough", max_examples=1000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("FP8JAX_HYPOTHESIS", "default"))
THOROUGH = os.environ.get("FP8JAX_HYPOTHESIS") == "thorough"


def pytest_collection_modifyitems(config, items):
  """Leaves out the tests marked ``thorough`` unless FP8JAX_HYPOTHESIS=thorough."""
  if THOROUGH:
    return
  keep = [item for item in items if item.get_closest_marker("thorough") is None]
  if len(keep) != len(items):
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


@pytest.fixture(scope="session")
def train_run(tmp_path_factory):
  """A tiny 3-layer training run (dense layer 0) with checkpoints 0, 2, 4, shared by the
  tests of one process; tests that damage it work on a copy."""
  from fp8jax.train import loop, run_config  # pylint: disable=import-outside-toplevel

  workdir = tmp_path_factory.mktemp("train")
  c = run_config.defaults()
  c.data.seq_len, c.data.global_batch = 32, 4
  c.optim.peak_lr, c.optim.warmup_steps = 3e-3, 1
  c.train.steps, c.train.save_every, c.train.log_every = 4, 2, 2
  loop.train(c, workdir)
  return workdir
