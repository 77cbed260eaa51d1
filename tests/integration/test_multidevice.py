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

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(part: str) -> dict:
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable, str(REPO / "tests" / "integration" / "multidevice_step.py"),
                        part],
                       capture_output=True, text=True, env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout)


@pytest.mark.slow
def test_four_devices_train_as_one():
  result = _run("train")
  assert result["devices"] == 4
  np.testing.assert_allclose(result["four"], result["one"], rtol=2e-5)
  assert "not divisible by the 4 devices" in result["error"]
  for name in ("four", "fsdp", "one4"):
    np.testing.assert_allclose(result[f"train_{name}"], result["train_one"], rtol=2e-5)
  assert "not divisible by the 4 devices" in result["loop_error"]
  assert result["per_layer_equal"]
  # FSDP in per-device programs: each device gathers a layer's weights and reduce-scatters
  # its gradient; the same training as the replicated state, a quarter of the arguments.
  np.testing.assert_allclose(result["fsdp_rows"], result["replicated_rows"], rtol=1e-6)
  assert result["fsdp_max_param_diff"] < 1e-6
  assert {"all-gather", "reduce-scatter"} <= set(result["fsdp_collectives"])
  assert "all-gather" not in result["replicated_collectives"]
  assert result["fsdp_argument_bytes"] < 0.35 * result["replicated_argument_bytes"]
  # gathered in bfloat16: half the bytes, the same training (the model casts them anyway)
  assert result["gather_bf16_params_equal"]
  assert "bf16" in result["gather_bf16_types"] and "bf16" not in result["gather_f32_types"]


@pytest.mark.slow
def test_sweeps_of_four_replicas_on_one_two_and_four_devices_agree():
  result = _run("sweep")
  for name in ("four", "pallas", "two"):
    np.testing.assert_allclose(result[f"sweep_{name}"], result["sweep_one"], rtol=1e-4)
  assert result["sweep_one"][1] > 0
