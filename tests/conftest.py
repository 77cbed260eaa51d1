"""Test configuration: CPU JAX, a persistent compilation cache, hypothesis profiles.

``FP8JAX_HYPOTHESIS`` picks the profile:

* ``default``: 40 examples per property; in CI (``CI=true``) derandomized, so that every
  run replays the same examples;
* ``explore``: 40 fresh examples per property from one seed per run, printed in the
  pytest header; ``FP8JAX_HYPOTHESIS_SEED=N`` (or ``--hypothesis-seed=N``) replays a run.
  CI runs every property test once more this way after the suite (``.ci/run``);
* ``thorough``: 1000 examples, and the tests marked ``thorough`` (many-example repeats of
  property tests that also run at default size), which the other profiles leave out.
"""

import os
import secrets
import zlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Many tests (and the binaries they start) compile the same tiny-model functions: a
# persistent compilation cache shared by the xdist workers and subprocesses saves minutes.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

from hypothesis import HealthCheck, settings  # noqa: E402
import pytest  # noqa: E402

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "default", max_examples=40, deadline=None, suppress_health_check=_SUPPRESS,
    derandomize=os.environ.get("CI", "").lower() == "true")
settings.register_profile(
    "explore", max_examples=40, deadline=None, suppress_health_check=_SUPPRESS,
    derandomize=False, print_blob=True)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=_SUPPRESS)
PROFILE = os.environ.get("FP8JAX_HYPOTHESIS", "default")
settings.load_profile(PROFILE)
THOROUGH = PROFILE == "thorough"
SEED_VARIABLE = "FP8JAX_HYPOTHESIS_SEED"


def pytest_configure(config):
  """An explore run (or one given FP8JAX_HYPOTHESIS_SEED) draws all examples from one
  seed: the given one, else a fresh one, exported so that xdist workers use it too. It
  reaches hypothesis as ``--hypothesis-seed`` (this hook runs before the plugin's)."""
  if config.getoption("hypothesis_seed", None) is not None or settings.default.derandomize:
    return
  seed = os.environ.get(SEED_VARIABLE)
  if seed is None and PROFILE != "explore":
    return
  seed = seed or str(secrets.randbelow(2**32))
  os.environ[SEED_VARIABLE] = seed
  config.option.hypothesis_seed = seed


def pytest_report_header(config):
  """How to replay this run's hypothesis examples; the slow tier's shard, if one."""
  seed = config.getoption("hypothesis_seed", None)
  if settings.default.derandomize:
    lines = [f"fp8jax hypothesis: profile {PROFILE}, derandomized (fixed examples)"]
  elif seed is not None:
    lines = [f"fp8jax hypothesis: profile {PROFILE}, seed {seed}; replay with "
             f"FP8JAX_HYPOTHESIS={PROFILE} {SEED_VARIABLE}={seed}"]
  else:
    lines = [f"fp8jax hypothesis: profile {PROFILE}, random examples (failures print a blob)"]
  shard = _shard()
  if shard:
    lines.append(f"fp8jax slow tests: shard {shard[0]}/{shard[1]} (the tests whose id's "
                 f"CRC-32 is {shard[0]} mod {shard[1]}, and {', '.join(EVERY_SHARD)}); every "
                 f"one: {SHARD_VARIABLE}=all")
  return lines


# The longest tests of the slow tier (minutes each on 2 cores), run first: xdist hands out
# tests in collection order, and one of these started last would keep a worker busy
# after the other has finished.
RUN_FIRST = ("tests/integration/test_multihost.py", "tests/integration/test_multidevice.py",
             "tests/models/test_layer_scan.py::test_stacked_scan_is_bit_identical_to_the_loop",
             "tests/study/comparison/test_sweep.py::test_formats_grid_end_to_end",
             "tests/integration/test_notebooks.py::test_notebook_runs_at_smoke_size",
             "tests/train/test_determinism.py::test_sweep_in_the_deterministic_mode",
             "tests/study/comparison/test_sweep.py::test_sweep_rows_details_and_zero_for_an_empty_policy",
             "tests/integration/test_compile_split.py", "tests/train/test_seed_group.py",
             "tests/train/test_data_parallel.py")


FAST_LIMIT_VARIABLE = "FP8JAX_FAST_TEST_LIMIT_S"
"""Seconds: when set (CI's suite step sets 10), a test outside the slow tier whose call takes
longer fails, naming its time, so that the suite stays within its budget as it grows."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Fails a passing fast-tier test that ran over :data:`FAST_LIMIT_VARIABLE` seconds."""
  outcome = yield
  limit = os.environ.get(FAST_LIMIT_VARIABLE)
  if not limit or call.when != "call" or item.get_closest_marker("slow") is not None:
    return
  report = outcome.get_result()
  if report.passed and call.duration > float(limit):
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid} took {call.duration:.1f} s, over the fast tier's {float(limit):g} s "
        f"({FAST_LIMIT_VARIABLE}): make it faster, or mark it @pytest.mark.slow")


SHARD_VARIABLE = "FP8JAX_SLOW_SHARD"
"""``i/k``: of the slow tests, only those in shard ``i`` of ``k`` (:func:`slow_shard`) and
those of :data:`EVERY_SHARD`; unset or ``all``: every one. CI runs one shard per commit
(``.ci/run``)."""
EVERY_SHARD = ("tests/integration/test_notebooks.py",
               "tests/integration/test_readme.py::test_readme")
"""Slow tests (node id prefixes) that run in every shard: the notebooks are executed, and the
README's examples run, in every CI run."""


def slow_shard(nodeid: str, k: int) -> int:
  """The shard (0..k-1) of a test, by the CRC-32 of its id (``tests/test_x.py::test_y[p]``):
  the longest files' tests spread over the shards. A run takes one shard, so a fixture
  that tests of one file share is still built at most once per run."""
  return zlib.crc32(nodeid.encode()) % k


def _shard() -> tuple[int, int] | None:
  value = os.environ.get(SHARD_VARIABLE, "all")
  if value == "all":
    return None
  try:
    i, k = (int(x) for x in value.split("/"))
  except ValueError:
    i, k = -1, 0
  if not 0 <= i < k:
    raise pytest.UsageError(f"{SHARD_VARIABLE}={value!r}: expected 'i/k' with 0 <= i < k, "
                            "or 'all'")
  return i, k


def pytest_collection_modifyitems(config, items):
  """Leaves out the tests marked ``thorough`` unless FP8JAX_HYPOTHESIS=thorough, and the
  slow tests outside the :data:`SHARD_VARIABLE` shard; puts the :data:`RUN_FIRST` tests
  first."""
  items.sort(key=lambda item: not item.nodeid.startswith(RUN_FIRST))  # stable
  shard = _shard()

  def kept(item) -> bool:
    if not THOROUGH and item.get_closest_marker("thorough") is not None:
      return False
    if shard is None or item.get_closest_marker("slow") is None:
      return True
    return (item.nodeid.startswith(EVERY_SHARD)
            or slow_shard(item.nodeid, shard[1]) == shard[0])

  keep, drop = [], []
  for item in items:
    (keep if kept(item) else drop).append(item)
  if drop:
    config.hook.pytest_deselected(items=drop)
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
