"""The validation matrix with ``train.eval_precision``: each run gets it from the matrix's
config, the summary compares the evaluation columns and says which precision it read, and
refuses runs evaluated differently."""

import json

import numpy as np
import pytest

from fp8jax.study.runs import validation
from fp8jax.train import run_config

RECIPES = ("bf16", "gemm:mxfp4")
TRAIN = {"bf16": 2.0, "gemm:mxfp4": 2.2}   # the training forward's tail loss
EVAL = {"bf16": 2.0, "gemm:mxfp4": 2.1}    # the same runs' BF16 evaluation


def _fake_train(cfg, workdir, resume, stream):
  """What ``loop.train`` writes, with losses by recipe: ``eval/*`` columns only when the
  config asks for an evaluation."""
  del resume, stream
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(cfg.to_json())
  with (workdir / "metrics.jsonl").open("w") as f:
    for step in range(1, 11):
      row = {"step": step, "loss": TRAIN[cfg.policy] + 0.01 * cfg.seed,
             "lm_loss": TRAIN[cfg.policy] + 0.01 * cfg.seed}
      if cfg.train.eval_precision:
        row["eval/lm_loss"] = row["eval/loss"] = EVAL[cfg.policy] + 0.01 * cfg.seed
      f.write(json.dumps(row) + "\n")
  return {"final_step": 10}


def _matrix(out, precision):
  c = run_config.defaults()
  c.train.eval_precision = precision
  m = validation.Matrix(RECIPES, (0, 1))
  validation.run_matrix(c, out, m, train_fn=_fake_train)
  return m


@pytest.mark.parametrize("precision, column, loss", [
    ("bf16", "eval/lm_loss", EVAL), ("", "lm_loss", TRAIN), ("train", "eval/lm_loss", EVAL)])
def test_the_summary_reads_the_runs_evaluation_and_says_which(tmp_path, precision, column,
                                                              loss):
  m = _matrix(tmp_path, precision)
  for recipe, seed in m.runs():
    saved = json.loads((tmp_path / "runs" / validation.run_name(recipe, seed) /
                        "config.json").read_text())
    assert saved["train"]["eval_precision"] == precision
  summary = validation.summarize(tmp_path, m)
  assert (summary["eval_precision"], summary["column"]) == (
      "bf16" if precision == "bf16" else "train", column)
  gaps = summary["recipes"]["gemm:mxfp4"]["gaps"]
  want = [(loss["gemm:mxfp4"] - loss["bf16"]) / (loss["bf16"] + 0.01 * s) for s in (0, 1)]
  np.testing.assert_allclose(gaps, want, rtol=1e-12)
  text = (tmp_path / "summary.md").read_text()
  said = {"bf16": "evaluated in BF16 (`eval/lm_loss`",
          "train": "evaluated in the training precision (`eval/lm_loss`: each recipe's",
          "": "evaluated in the training precision (`lm_loss`: the training forward's loss)"}
  assert said[precision] in text
  assert json.loads((tmp_path / "summary.json").read_text())["eval_precision"] == (
      summary["eval_precision"])


def test_runs_evaluated_differently_are_refused(tmp_path):
  m = _matrix(tmp_path, "bf16")
  run = tmp_path / "runs" / validation.run_name("gemm:mxfp4", 1)
  saved = json.loads((run / "config.json").read_text())
  saved["train"]["eval_precision"] = ""
  (run / "config.json").write_text(json.dumps(saved))
  with pytest.raises(ValueError, match=r"evaluated differently .*bf16 \(eval/lm_loss\): "
                                       r"bf16_s0, gemm_mxfp4_s0, bf16_s1; train \(lm_loss\): "
                                       r"gemm_mxfp4_s1"):
    validation.summarize(tmp_path, m)
