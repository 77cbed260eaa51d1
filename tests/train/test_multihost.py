"""The multi-process environment (fp8jax/train/multihost.py): a bad one named before any
process starts. (Several processes: tests/integration/test_multihost.py.)"""

import pytest

from fp8jax.train import multihost


@pytest.mark.parametrize("env, error", [
    ({"JAX_NUM_PROCESSES": "2"}, "JAX_NUM_PROCESSES is set but JAX_PROCESS_ID is not"),
    ({"JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"}, "JAX_NUM_PROCESSES='two' is not"),
])
def test_initialize_names_a_bad_environment(monkeypatch, env, error):
  for name in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  with pytest.raises(ValueError, match=error):
    multihost.initialize()
