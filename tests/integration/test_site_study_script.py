"""scripts/gpu/site_study_2b.sh at tiny size on CPU: killed mid-way, rerun, complete; its
default policies are known grids and expressions."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from fp8jax.models import registry
from fp8jax.study.comparison import sweep

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu" / "site_study_2b.sh"


def _env(work) -> dict:
  return {**os.environ, "SIZE": "tiny", "WORK": str(work), "PY": sys.executable,
          "POLICIES": "attn_l0_e4m3", "BRANCH_POLICIES": "attn_l0_e4m3", "STEPS": "6",
          "BRANCH_FROM": "4", "BRANCH_AFTER": "2", "BATCHES": "1", "JAX_PLATFORMS": "cpu",
          "FP8JAX_COMPILE_CACHE": str(REPO / ".cache" / "jax-tests")}  # shared by reruns


def _start(work, results, deadline=600):
  return subprocess.Popen(["bash", str(SCRIPT), str(results), str(deadline)], cwd=REPO,
                          env=_env(work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)


@pytest.mark.slow
def test_killed_during_training_then_rerun_finishes_every_stage(tmp_path):
  work, results = tmp_path / "work", tmp_path / "results"
  first = _start(work, results)
  ckpts = work / "train" / "checkpoints"
  deadline = time.monotonic() + 300
  while not (ckpts / "2").is_dir() and first.poll() is None and time.monotonic() < deadline:
    time.sleep(0.5)
  os.killpg(first.pid, signal.SIGKILL)  # mid-training: the script and its binaries
  first.wait()
  assert not (work / "done" / "all").exists()
  again = _start(work, results)
  out, _ = again.communicate(timeout=600)
  assert again.returncode == 0 and "all stages done" in out, out[-3000:]
  done = sorted(p.name for p in (results / "done").iterdir())
  assert done == sorted(["all", "branch_2", "branch_4", "report", "report_branches",
                         "train_4", "train_6", "verify",
                         *(f"compare_{s}" for s in (0, 2, 4, 6))])
  steps = sorted(int(p.name) for p in (results / "train" / "checkpoints").iterdir())
  assert steps == [0, 2, 4, 6]
  kinds = {s: (results / "train" / "checkpoints" / str(s) / "kind.txt").read_text().strip()
           for s in steps}
  assert kinds == {0: "params_only", 2: "full", 4: "params_only", 6: "full"}  # 2: BRANCH_AFTER
  rows = (results / "compare" / "rows.jsonl").read_text().splitlines()
  assert len(rows) == 4 * 2 * 2  # checkpoints x offsets x (policy, floor), one batch each
  assert (results / "compare" / "report.md").exists()
  branches = [json.loads(ln) for ln in (results / "branch" / "branches.jsonl").open()]
  assert {(b["from_step"], b["branch"]) for b in branches} >= {(4, "attn_l0_e4m3"),
                                                                (2, "attn_l0_e4m3")}
  logged = [json.loads(ln)["step"] for ln in (results / "train" / "metrics.jsonl").open()]
  assert logged[-1] == 6 and logged == sorted(set(logged))
  assert "ok" in (results / "train" / "verify.txt").read_text()
  calls = (results / "logs" / "calls.txt").read_text()
  assert calls.count("call ") >= 2 and "SIZE=tiny" in calls


def test_the_scripts_default_policies_are_known_grids_and_expressions():
  text = SCRIPT.read_text()
  defaults = re.findall(r"POLICIES:-([^}]+)\}", text)
  assert len(defaults) == 3  # tiny's and 2B's compare grids, the branches' grid
  for size, spec in zip(["tiny", "deepseek_moe_2b", "deepseek_moe_2b"], defaults):
    specs = re.findall(r"noise\([^)]*\)|[^,]+", spec)
    assert sweep.expand_policies(specs, registry.get(size)), spec
