"""Data parallel on 4 simulated CPU devices equals one device: the train step, the
training loop (replicated, 4 replicas on one device, and FSDP) and the comparison sweep
of 4 replicas on 1, 2 and 4 devices (XLA MoE, and the Pallas MoE per device)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_four_devices_match_one():
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable, str(REPO / "tests" / "multidevice_step.py")],
                       capture_output=True, text=True, env=env, check=True, timeout=600)
  result = json.loads(out.stdout)
  assert result["devices"] == 4
  np.testing.assert_allclose(result["four"], result["one"], rtol=2e-5)
  assert "not divisible by the 4 devices" in result["error"]
  for name in ("four", "fsdp", "one4"):
    np.testing.assert_allclose(result[f"train_{name}"], result["train_one"], rtol=2e-5)
  for name in ("four", "pallas", "two"):
    np.testing.assert_allclose(result[f"sweep_{name}"], result["sweep_one"], rtol=1e-4)
  assert result["sweep_one"][1] > 0
  assert "not divisible by the 4 devices" in result["loop_error"]
