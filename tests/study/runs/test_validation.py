"""The validation matrix at smoke size: runs skipped when done, a deadline that stops a run
through its preemption watch, and the summary against a separate NumPy/SciPy computation."""

import json
import math
import os
import pathlib
import signal
import threading
import time

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp8jax.data import folder_lock
from fp8jax.study.runs import validation
from fp8jax.train import preemption, run_config
from tests.helpers import held_elsewhere

RECIPES = ("bf16", "attn@0-1:e5m2")


def _config(steps=4):
  c = run_config.defaults()
  c.model_overrides.num_hidden_layers = 2
  c.train.steps, c.train.save_every, c.train.log_every = steps, 2, 1
  c.optim.warmup_steps = 1
  return c


def test_matrix_checks_its_recipes_and_seeds():
  with pytest.raises(ValueError, match="reference 'bf16'"):
    validation.Matrix(("gemm:fp8_tensor",), (0,))
  with pytest.raises(ValueError, match="repeated"):
    validation.Matrix(("bf16", "bf16"), (0,))
  with pytest.raises(ValueError, match="seeds must be >= 0"):
    validation.Matrix(("bf16",), (-1,))
  with pytest.raises(ValueError, match="unknown GEMM recipe"):
    validation.Matrix(("bf16", "gemm:nosuch"), (0,))
  m = validation.Matrix(("gemm:fp8_tensor", "bf16"), validation.parse_seeds(["0-1"]))
  assert m.runs() == [("bf16", 0), ("gemm:fp8_tensor", 0), ("bf16", 1),
                      ("gemm:fp8_tensor", 1)]
  assert validation.run_name("gemm:fp32_blockwise", 2) == "gemm_fp32_blockwise_s2"
  assert validation.run_name("attn@0-1:e5m2", 0) == "attn_0-1_e5m2_s0"


def _tail_reference(workdir, tail=0.1):
  """The tail mean of lm_loss, read here from metrics.jsonl."""
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  values = [r["lm_loss"] for r in sorted(rows, key=lambda r: r["step"])]
  k = max(1, math.ceil(tail * len(values)))
  return float(np.mean(values[-k:]))


@pytest.mark.slow
def test_matrix_trains_skips_and_summarizes(tmp_path):
  m = validation.Matrix(RECIPES, (0, 1, 2))
  past = validation.run_matrix(_config(), tmp_path, m, deadline=time.monotonic() - 1)
  assert past == {"done": [], "stopped": [], "busy": [],
                  "pending": [validation.run_name(r, s) for r, s in m.runs()]}
  assert not (tmp_path / "runs").exists()
  outcome = validation.run_matrix(_config(), tmp_path, m)
  assert len(outcome["done"]) == 6
  calls = []
  again = validation.run_matrix(_config(), tmp_path, m, train_fn=lambda *a, **k: calls.append(a))
  assert again["done"] == outcome["done"] and not calls  # finished runs are not trained again
  summary = validation.summarize(tmp_path, m, bound=0.0025)
  tails = {(r, s): _tail_reference(tmp_path / "runs" / validation.run_name(r, s))
           for r, s in m.runs()}
  ref = [tails[("bf16", s)] for s in m.seeds]
  assert summary["bf16_spread"] == pytest.approx(np.std(ref, ddof=1) / np.mean(ref))
  gaps = [(tails[(RECIPES[1], s)] - tails[("bf16", s)]) / tails[("bf16", s)] for s in m.seeds]
  got = summary["recipes"][RECIPES[1]]
  assert got["gaps"] == pytest.approx(gaps)
  lo, hi = scipy_stats.t.interval(0.95, len(gaps) - 1, loc=np.mean(gaps),
                                  scale=scipy_stats.sem(gaps))
  assert (got["gap"]["lo"], got["gap"]["hi"]) == pytest.approx((lo, hi), rel=1e-3)
  assert summary["recipes"]["bf16"]["gaps"] == [0.0, 0.0, 0.0]
  assert len(set(ref)) == 3  # the seeds give different runs
  md = (tmp_path / "summary.md").read_text()
  assert RECIPES[1] in md and got["verdict"] in md
  assert json.loads((tmp_path / "summary.json").read_text())["seeds"] == [0, 1, 2]


def test_deadline_stops_a_run_through_its_preemption_watch(tmp_path):
  """The deadline waits for the run's SIGTERM handler, then the run stops as preempted;
  the matrix goes on with the next runs pending and its own handler restored."""
  seen = []

  def slow_train(cfg, workdir, resume, stream):
    seen.append((cfg.policy, cfg.seed, resume))
    time.sleep(0.3)  # compiling: no watch yet, a signal now would find nothing to save
    stop = []
    previous = signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    try:
      for _ in range(200):
        if stop:
          raise preemption.Preempted(3, workdir)
        time.sleep(0.05)
    finally:
      signal.signal(signal.SIGTERM, previous)
    raise AssertionError("the deadline did not stop the run")

  before = signal.getsignal(signal.SIGTERM)
  m = validation.Matrix(("bf16", "gemm:fp8_tensor"), (0,))
  out = validation.run_matrix(_config(), tmp_path, m, deadline=time.monotonic() + 0.1,
                              train_fn=slow_train)
  assert out == {"done": [], "stopped": ["bf16_s0"], "pending": ["gemm_fp8_tensor_s0"],
                 "busy": []}
  assert seen == [("bf16", 0, False)]
  assert signal.getsignal(signal.SIGTERM) is before


def test_processes_share_a_matrix(tmp_path):
  """A run whose folder another writer holds is skipped (``busy``), not trained twice; the
  lock is held until done.json is written, and a finished run is not trained again."""
  m = validation.Matrix(("bf16", "gemm:fp8_tensor"), (0,))
  trained = []

  def fake_train(cfg, workdir, resume, stream):
    trained.append(workdir.name)
    refused = []

    def try_hold():  # another writer meanwhile: refused, the matrix holds the folder
      try:
        with folder_lock.hold(workdir):
          pass
      except folder_lock.FolderLockedError:
        refused.append(True)

    t = threading.Thread(target=try_hold)
    t.start()
    t.join()
    assert refused
    return {"final_step": 4}

  with held_elsewhere(tmp_path / "runs" / "bf16_s0"):  # another writer holds bf16_s0
    out = validation.run_matrix(_config(), tmp_path, m, train_fn=fake_train)
  assert out["busy"] == ["bf16_s0"] and out["done"] == ["gemm_fp8_tensor_s0"]
  assert trained == ["gemm_fp8_tensor_s0"]
  assert json.loads((tmp_path / "runs" / "gemm_fp8_tensor_s0" / "done.json").read_text())[
      "final_step"] == 4
  out = validation.run_matrix(_config(), tmp_path, m, train_fn=fake_train)
  assert trained == ["gemm_fp8_tensor_s0", "bf16_s0"] and not out["busy"]


def test_a_run_stopped_without_checkpoint_starts_again(tmp_path):
  """No checkpoint: trained from step 0 (resume=False), the stopped run's metrics kept
  aside; with a checkpoint: resumed."""
  m = validation.Matrix(("bf16",), (0,))
  run = tmp_path / "runs" / "bf16_s0"
  run.mkdir(parents=True)
  (run / "config.json").write_text("{}")
  (run / "metrics.jsonl").write_text('{"step": 10}\n')
  calls = []

  def fake_train(cfg, workdir, resume, stream):
    calls.append(resume)
    assert not (workdir / "metrics.jsonl").exists()
    return {"final_step": 4}

  validation.run_matrix(_config(), tmp_path, m, train_fn=fake_train)
  assert calls == [False]
  assert (run / "metrics.jsonl.stopped-0").read_text() == '{"step": 10}\n'
  (run / "done.json").unlink()
  (run / "checkpoints" / "10").mkdir(parents=True)
  validation.run_matrix(_config(), tmp_path, m, train_fn=lambda c, w, resume, stream:
                        calls.append(resume) or {})
  assert calls == [False, True]


def _fake_run(out, recipe, seed, tail_loss):
  """A finished run whose last logged losses are all ``tail_loss``."""
  run = out / "runs" / validation.run_name(recipe, seed)
  run.mkdir(parents=True)
  rows = [{"step": 10 * i, "loss": 5.0, "lm_loss": 5.0 if i < 5 else tail_loss}
          for i in range(10)]
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (run / "config.json").write_text(json.dumps({"policy": recipe, "seed": seed}))
  (run / "done.json").write_text("{}")


def test_contrasts_pair_the_gaps_by_seed(tmp_path):
  """gap(a) - gap(b) per seed against a separate computation and SciPy's t-interval; a
  seed where b did not finish is left out of the pairs; a contrast of an unknown recipe
  fails before any run."""
  m = validation.Matrix(("bf16", "gemm:mxfp4", "gemm:nvfp4"), (0, 1, 2, 3))
  bf16 = [2.00, 2.01, 1.99, 2.02]
  mx = [2.030, 2.045, 2.018, 2.050]
  nv = [2.015, 2.020, 2.010, None]
  for s in range(4):
    _fake_run(tmp_path, "bf16", s, bf16[s])
    _fake_run(tmp_path, "gemm:mxfp4", s, mx[s])
    if nv[s] is not None:
      _fake_run(tmp_path, "gemm:nvfp4", s, nv[s])
  summary = validation.summarize(tmp_path, m, contrasts=[("gemm:mxfp4", "gemm:nvfp4")])
  (c,) = summary["contrasts"]
  want = [(mx[s] - bf16[s]) / bf16[s] - (nv[s] - bf16[s]) / bf16[s] for s in range(3)]
  assert c["diffs"] == pytest.approx(want)
  lo, hi = scipy_stats.t.interval(0.95, 2, loc=np.mean(want), scale=scipy_stats.sem(want))
  assert (c["diff"]["lo"], c["diff"]["hi"]) == pytest.approx((lo, hi), rel=1e-3)
  assert c["verdict"] == ("a > b" if lo > 0 else "cannot tell")
  md = (tmp_path / "summary.md").read_text()
  assert "| gemm:mxfp4 | gemm:nvfp4 | 3 |" in md
  assert summary["modes"] == {"default": 11} and "GPU mode of the runs: default (11)" in md
  assert validation.parse_contrast(" gemm:mxfp4 vs gemm:nvfp4 ", m) == ("gemm:mxfp4",
                                                                        "gemm:nvfp4")
  with pytest.raises(ValueError, match="not among the recipes"):
    validation.parse_contrast("gemm:mxfp4 vs gemm:fp32_blockwise", m)
  with pytest.raises(ValueError, match="RECIPE_A vs RECIPE_B"):
    validation.parse_contrast("gemm:mxfp4,gemm:nvfp4", m)


def test_probe_ratios_are_summarized(tmp_path):
  """A run that logged probe/ratio: its first and last ratio, the first step below
  sqrt(3) and the LM loss's drop from there to the end; runs without probes are absent."""
  m = validation.Matrix(("bf16", "gemm:mxfp4"), (0,))
  _fake_run(tmp_path, "bf16", 0, 2.0)
  _fake_run(tmp_path, "gemm:mxfp4", 0, 2.1)
  path = tmp_path / "runs" / "gemm_mxfp4_s0" / "metrics.jsonl"
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  for r, ratio in zip(rows[1::2], (4.0, 2.5, 1.9, 1.6, 1.2)):  # steps 10, 30, 50, 70, 90
    r["probe/ratio"] = ratio
  rows[3]["lm_loss"] = 2.3  # step 30
  rows[7]["lm_loss"] = 2.25  # step 70: the crossing
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  summary = validation.summarize(tmp_path, m)
  assert list(summary["probes"]) == ["gemm:mxfp4"]
  p = summary["probes"]["gemm:mxfp4"][0]
  assert (p["first"], p["last"], p["cross_step"]) == (4.0, 1.2, 70)
  assert p["lm_drop_after"] == pytest.approx(2.25 - 2.1)
  assert "| gemm:mxfp4 | 0 | 4.00 | 1.20 | 70 | 0.1500 |" in (tmp_path / "summary.md").read_text()


def test_verdicts():
  stat = lambda lo, hi: validation.Stat((lo + hi) / 2, lo, hi, 3)  # noqa: E731
  assert validation.verdict(stat(-0.001, 0.002), 0.0025) == "within"
  assert validation.verdict(stat(0.003, 0.01), 0.0025) == "outside"
  assert validation.verdict(stat(-0.01, -0.003), 0.0025) == "outside"
  assert validation.verdict(stat(0.001, 0.004), 0.0025) == "cannot tell"
  assert validation.verdict(validation.Stat(0.0, math.nan, math.nan, 1), 0.0025) == (
      "cannot tell")


@pytest.mark.slow
def test_binary_smoke(tmp_path):
  """The binary reports bad recipes in one line, exit 2."""
  import subprocess
  import sys
  repo = pathlib.Path(__file__).resolve().parents[3]
  bad = subprocess.run([sys.executable, "-m", "fp8jax.experiments.validate",
                        f"--out={tmp_path}", "--recipes=gemm:fp8_tensor"],
                       capture_output=True, text=True, cwd=repo, timeout=120)
  assert bad.returncode == 2 and bad.stderr.strip().startswith("error:")
  assert "reference 'bf16'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_binary_trains_a_small_matrix_in_seed_groups(tmp_path):
  """The matrix's smallest version end to end: the binary with --group_seeds trains BF16 x
  2 seeds (2 steps each) as one group, writes done.json per run and the summary; a second
  call trains nothing."""
  import subprocess
  import sys
  repo = pathlib.Path(__file__).resolve().parents[3]
  cmd = [sys.executable, "-m", "fp8jax.experiments.validate",
         f"--config={repo / 'experiments/configs/train_tiny.py'}", "--config.train.steps=2",
         "--config.train.log_every=1", "--config.train.checkpoints=False",
         "--config.data.global_batch=2", "--config.data.seq_len=32",
         "--config.optim.warmup_steps=1", "--recipes=bf16", "--seeds=0-1",
         "--group_seeds", f"--out={tmp_path}"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  first = subprocess.run(cmd, capture_output=True, text=True, cwd=repo, timeout=600, env=env)
  assert first.returncode == 0, first.stderr[-2000:]
  assert "done: 2 of 2 runs finished" in first.stdout
  for name in ("bf16_s0", "bf16_s1"):
    record = json.loads((tmp_path / "runs" / name / "done.json").read_text())
    assert record["group"] == [0, 1] and record["final_step"] == 2
  assert "| bf16 | 2 |" in (tmp_path / "summary.md").read_text()
  again = subprocess.run(cmd, capture_output=True, text=True, cwd=repo, timeout=600, env=env)
  assert again.returncode == 0 and "seeds [" not in again.stderr
