"""Branch-off runs on the tiny run of ``train_run`` (checkpoints 0, 2, 4): exactness of an
empty policy, the noise floor, resume after a kill, refusals; the step metrics against a
NumPy float64 reference."""

import io
import json
import math
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.study.branches import branch, branch_metrics
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


def _np_tree(rng, shapes):
  return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


@pytest.mark.slow
def test_compare_step_against_float64_reference():
  rng = np.random.default_rng(0)
  shapes = {"layers": {"0": {"self_attn": {"o_proj": {"kernel": (8, 4)}},
                             "mlp": {"down_proj": {"kernel": (6, 8)}}},
                       "1": {"self_attn": {"o_proj": {"kernel": (8, 4)}}}},
            "embed_tokens": {"embedding": (5, 8)}}
  flat_shapes = {}

  def walk(tree, prefix=()):
    for k, v in tree.items():
      if isinstance(v, dict):
        walk(v, (*prefix, k))
      else:
        flat_shapes[(*prefix, k)] = v
  walk(shapes)

  def build(values):
    out: dict = {}
    for path, v in values.items():
      node = out
      for k in path[:-1]:
        node = node.setdefault(k, {})
      node[path[-1]] = jnp.asarray(v)
    return out

  trees = [_np_tree(rng, flat_shapes) for _ in range(4)]  # ref_new, ref_prev, new, prev
  topk = jnp.asarray(rng.integers(0, 4, (2, 3, 2)))
  other = topk.at[0, 0].set(jnp.asarray([3, 2]) if int(topk[0, 0, 0]) < 2 else jnp.asarray([0, 1]))
  counts = jnp.ones((4,), jnp.int32)
  routing = lambda t: {1: {"topk_ids": t, "expert_counts": counts}}  # noqa: E731
  got = jax.device_get(branch_metrics.compare_step(*(build(t) for t in trees),
                                                   routing(topk), routing(other)))
  f64 = [{k: v.astype(np.float64) for k, v in t.items()} for t in trees]
  num = sum(np.sum((f64[2][k] - f64[0][k]) ** 2) for k in flat_shapes)
  den = sum(np.sum(f64[0][k] ** 2) for k in flat_shapes)
  assert float(got["param_div"]) == pytest.approx(math.sqrt(num / den), rel=1e-5)
  d_b = np.concatenate([(f64[2][k] - f64[3][k]).ravel() for k in flat_shapes])
  d_r = np.concatenate([(f64[0][k] - f64[1][k]).ravel() for k in flat_shapes])
  cos = d_b @ d_r / np.linalg.norm(d_b) / np.linalg.norm(d_r)
  assert float(got["update_cos"]) == pytest.approx(cos, rel=1e-5, abs=1e-6)
  keys = [k for k in flat_shapes if k[1] == "0"]
  layer0 = math.sqrt(sum(np.sum((f64[2][k] - f64[0][k]) ** 2) for k in keys)
                     / sum(np.sum(f64[0][k] ** 2) for k in keys))
  assert float(got["by_layer"].column("param_div")["0"]) == pytest.approx(layer0, rel=1e-5)
  changed = np.any(np.sort(np.asarray(topk), -1) != np.sort(np.asarray(other), -1), -1)
  assert float(got["routing_diff"]) == pytest.approx(changed.mean())


def test_growth_rate_and_perturbation():
  assert branch_metrics.growth_rate([math.exp(0.3 * t) * 1e-3 for t in range(6)]) == (
      pytest.approx(0.3))
  assert branch_metrics.growth_rate([1e-3, None, 0.0]) is None
  x = {"w": jnp.linspace(-2.0, 3.0, 1001)}
  a = branch_metrics.perturb(x, jax.random.key(0))
  rel = np.abs(np.asarray(a["w"]) / np.asarray(x["w"]) - 1)
  assert np.all(rel <= 2**-8 * (1 + 1e-6)) and np.mean(rel) > 2**-10
  np.testing.assert_array_equal(a["w"], branch_metrics.perturb(x, jax.random.key(0))["w"])


def test_record_of_a_nonfinite_step_names_it_and_keeps_no_loss():
  from fp8jax.metrics.table import Table  # pylint: disable=import-outside-toplevel
  m = {"loss": np.float32(np.nan), "finite": False,
       "finite_groups": {"params": {"w": True}, "grads": {"w": False}}}
  cmp = {"param_div": 0.01, "update_cos": np.nan, "routing_diff": 0.1,
         "routing_by_layer": {1: 0.1},
         "by_module": Table(["attn_o"], {"param_div": np.array([0.01])}),
         "by_layer": Table(["0"], {"param_div": np.array([0.01])})}
  rec = branch_metrics.record(3, m, 2.5, cmp)
  assert rec["nonfinite"] == "step 3: grads/w" and rec["loss"] is None
  assert rec["loss_gap"] is None and rec["update_cos"] is None and rec["routing_diff"] is None
  assert rec["param_div"] == 0.01  # the skipped step left the params as they were


@pytest.mark.slow
def test_study_pipeline_report_answers_the_trajectory_question(train_run, tmp_path):
  """The end-to-end study with a branch stage (on a copy of the tiny run, already trained):
  the report relates the sweep to the branches."""
  import shutil  # pylint: disable=import-outside-toplevel

  from fp8jax.study import pipeline  # pylint: disable=import-outside-toplevel
  from fp8jax.study.comparison import sweep  # pylint: disable=import-outside-toplevel
  from fp8jax.train import run_config  # pylint: disable=import-outside-toplevel
  shutil.copytree(train_run, tmp_path / "train")
  path = pipeline.run_study(run_config.load_saved(train_run), tmp_path,
                            policies=["attn_l0_e4m3", "moe_l1-2_e4m3"],
                            windows=sweep.Windows(offsets=(0,), batches=1, batch_size=4),
                            branches=branch.Branches(k=K))
  text = path.read_text()
  section = text.split("## Does the one-step perturbation predict the trajectory?")[1]
  assert "Spearman" in section and "noise floor" in section.lower()
  assert "| rel_err | param_div | 6 |" in section  # 3 checkpoints x 2 policies joined
  assert (tmp_path / "compare" / "figures" / "trajectory.png").exists()
  assert len(results_io.read(tmp_path / "branch" / "branches.jsonl")) == 3 * 4
