"""The validation matrix at smoke size: runs skipped when done, a deadline that stops a run
through its preemption watch, and the summary against a separate NumPy/SciPy computation."""

import json
import math
import pathlib
import signal
import time

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp8jax.study.runs import validation
from fp8jax.train import preemption, run_config

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
  assert past == {"done": [], "stopped": [], "pending": [validation.run_name(r, s)
                                                          for r, s in m.runs()]}
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
  assert out == {"done": [], "stopped": ["bf16_s0"], "pending": ["gemm_fp8_tensor_s0"]}
  assert seen == [("bf16", 0, False)]
  assert signal.getsignal(signal.SIGTERM) is before


def test_verdicts():
  stat = lambda lo, hi: validation.Stat((lo + hi) / 2, lo, hi, 3)  # noqa: E731
  assert validation.verdict(stat(-0.001, 0.002), 0.0025) == "within"
  assert validation.verdict(stat(0.003, 0.01), 0.0025) == "outside"
  assert validation.verdict(stat(-0.01, -0.003), 0.0025) == "outside"
  assert validation.verdict(stat(0.001, 0.004), 0.0025) == "cannot tell"
  assert validation.verdict(validation.Stat(0.0, math.nan, math.nan, 1), 0.0025) == (
      "cannot tell")


def test_binary_smoke(tmp_path):
  """The binary reports bad recipes in one line, exit 2."""
  import subprocess
  import sys
  repo = pathlib.Path(__file__).resolve().parents[1]
  bad = subprocess.run([sys.executable, "-m", "fp8jax.experiments.validate",
                        f"--out={tmp_path}", "--recipes=gemm:fp8_tensor"],
                       capture_output=True, text=True, cwd=repo, timeout=120)
  assert bad.returncode == 2 and bad.stderr.strip().startswith("error:")
  assert "reference 'bf16'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
