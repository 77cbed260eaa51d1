"""Branch-off runs on the tiny run of ``train_run`` (checkpoints 0, 2, 4): exactness of an
empty policy, the noise floor, resume after a kill, refusals (the step metrics:
test_branch_metrics.py; the study end to end: tests/study/test_pipeline.py)."""

import io
import json
import math
import pathlib
import re
import subprocess
import sys

import pytest

from fp8jax.study.branches import branch
from fp8jax.study.common import results_io
from fp8jax.train import metrics_log

REPO = pathlib.Path(__file__).resolve().parents[3]
K = 2


def _rows(out) -> dict:
  return {(r["from_step"], r["branch"]): r for r in results_io.read(out / "branches.jsonl")}


@pytest.fixture(scope="module")
def branched(train_run, tmp_path_factory):
  out = tmp_path_factory.mktemp("branch")
  branch.run(train_run, out, policies=["bf16", "attn_l0_e4m3"], from_steps=[2, 4],
             branches=branch.Branches(k=K))
  return out


@pytest.mark.slow
def test_empty_policy_branch_is_the_bf16_branch_bit_for_bit(branched, train_run):
  rows = _rows(branched)
  assert set(rows) == {(s, b) for s in (2, 4)
                       for b in ("bf16", "noise", "bf16_policy", "attn_l0_e4m3")}
  for s in (2, 4):
    same = rows[(s, "bf16_policy")]
    assert same["kind"] == "policy" and same["steps"] == [1, 2]
    assert same["param_div"] == [0.0, 0.0] and same["loss_gap"] == [0.0, 0.0]
    assert same["routing_diff"] == [0.0, 0.0] and all(same["finite"])
    assert all(v == 0.0 for vals in same["param_div_by_module"].values() for v in vals)
    assert same["update_cos"] == pytest.approx([1.0, 1.0], abs=1e-6)
    fp8 = rows[(s, "attn_l0_e4m3")]
    assert all(d > 0 for d in fp8["param_div"]) and all(g != 0 for g in fp8["loss_gap"])
    assert fp8["param_div_by_layer"]["0"][-1] > 0 and fp8["growth_rate"] is not None
    assert all(0.5 < c < 1 for c in fp8["update_cos"])
  # The reference continues the run: same batches, optimizer state and schedule, so its
  # second step from checkpoint 2 is the run's step 4 (logged).
  logged = {r["step"]: r["loss"] for r in metrics_log.read_rows(train_run / "metrics.jsonl")}
  assert rows[(2, "bf16")]["loss"][1] == pytest.approx(logged[4], rel=1e-6)
  meta = json.loads((branched / "meta.json").read_text())
  assert meta["k"] == K and meta["from_steps"] == [2, 4]
  assert meta["policies"]["attn_l0_e4m3"]["expr"].startswith("attn_out@0:")
  assert meta["policies"]["attn_l0_e4m3"]["record"]["cell"] == {
      "module": "attn", "depth": "l0", "format": "e4m3"}


@pytest.mark.slow
def test_noise_floor_is_nonzero_and_reproducible(branched, train_run, tmp_path):
  rows = _rows(branched)
  noise = rows[(2, "noise")]
  assert noise["kind"] == "noise" and all(0 < d < 0.05 for d in noise["param_div"])
  # Uniform relative noise of size 2^-8: ||delta|| / ||theta|| near 2^-8 / sqrt(3) at start.
  assert noise["param_div"][0] == pytest.approx(2**-8 / math.sqrt(3), rel=0.3)
  again = tmp_path / "again"
  said = io.StringIO()
  branch.run(train_run, again, policies=[], from_steps=[2], branches=branch.Branches(k=K),
             stream=said)
  assert _rows(again)[(2, "noise")] == noise
  lines = said.getvalue().splitlines()  # one step compiled (the noise branch runs BF16)
  assert lines[0] == "[branch] compiling the step of policy bf16 (1/1)..."
  assert re.fullmatch(r"\[branch\] compiled the step of policy bf16 in \d+\.\d s "
                      r"\(with its first run\)", lines[1]), lines
  assert sum("compil" in ln for ln in lines) == 2
  other = tmp_path / "other"
  branch.run(train_run, other, policies=[], from_steps=[2],
             branches=branch.Branches(k=K, noise_seed=1))
  assert _rows(other)[(2, "noise")]["param_div"] != noise["param_div"]


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_numbers(branched, train_run, tmp_path, monkeypatch):
  out = tmp_path / "killed"
  real, calls = results_io.append, []

  def dying_append(path, row):
    if len(calls) == 5:  # a kill after five lines: checkpoint 2's four, one of checkpoint 4
      with open(path, "a") as f:
        f.write('{"from_step": 4, "bra')  # a torn line, as a kill mid-write leaves
      raise KeyboardInterrupt
    calls.append(row)
    real(path, row)

  monkeypatch.setattr(branch.results_io, "append", dying_append)
  with pytest.raises(KeyboardInterrupt):
    branch.run(train_run, out, policies=["bf16", "attn_l0_e4m3"], from_steps=[2, 4],
               branches=branch.Branches(k=K))
  monkeypatch.setattr(branch.results_io, "append", real)
  assert len(results_io.read(out / "branches.jsonl")) == 5
  summary = branch.run(train_run, out, policies=["bf16", "attn_l0_e4m3"], from_steps=[2, 4],
                       branches=branch.Branches(k=K))
  assert summary["rows_written"] == 3
  lines = (out / "branches.jsonl").read_text().splitlines()
  assert len(lines) == 8 and all(json.loads(line) for line in lines)
  assert _rows(out) == _rows(branched)
  assert branch.run(train_run, out, policies=["bf16", "attn_l0_e4m3"], from_steps=[2, 4],
                    branches=branch.Branches(k=K))["rows_written"] == 0


@pytest.mark.slow
def test_refusals_before_compute(train_run, branched, tmp_path):
  with pytest.raises(ValueError, match=r"checkpoints \[3\] are not in"):
    branch.run(train_run, tmp_path / "a", policies=[], from_steps=[3])
  with pytest.raises(ValueError, match="different k"):
    branch.run(train_run, branched, policies=[], from_steps=[2], branches=branch.Branches(k=3))
  with pytest.raises(ValueError, match="unknown"):
    branch.run(train_run, tmp_path / "b", policies=["attn@0:e9m9"], from_steps=[2])
  with pytest.raises(ValueError, match="at least one noise"):
    branch.Branches(noise=0)
  proc = subprocess.run(
      [sys.executable, "-m", "fp8jax.experiments.branch", f"--train_workdir={train_run}",
       f"--out={tmp_path / 'c'}", "--from_steps=7", "--policies=attn_l0_e4m3"],
      capture_output=True, text=True, cwd=REPO,
      env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}, timeout=300)
  assert proc.returncode == 2 and "checkpoints [7] are not in" in proc.stderr


@pytest.mark.slow
def test_checkpoint_of_another_policy_needs_the_flag(train_run, tmp_path):
  from fp8jax.train import loop, run_config  # pylint: disable=import-outside-toplevel
  assert branch.trained_policy({"policy": "bf16"}) == ("bf16", True)
  assert branch.trained_policy({}) == ("bf16", True)
  c = run_config.load_saved(train_run)
  c.policy, c.train.steps, c.train.save_every = "attn@0:e4m3", 1, 1
  loop.train(c, tmp_path / "fp8run")
  with pytest.raises(ValueError, match=r"trained under policy 'attn@0:e4m3'.*allow_policy"):
    branch.run(tmp_path / "fp8run", tmp_path / "b", policies=[], from_steps=[1])
  branch.run(tmp_path / "fp8run", tmp_path / "b", policies=[], from_steps=[1],
             branches=branch.Branches(k=1), allow_policy_change=True)
  assert {r["branch"] for r in results_io.read(tmp_path / "b" / "branches.jsonl")} == {
      "bf16", "noise"}
