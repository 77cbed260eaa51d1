"""The validation figure (``fp8jax.study.runs.validation_figures``): the loss and gap
curves of fake finished runs, and the PNG drawn from them."""

import json

import numpy as np
import pytest

from fp8jax.study.runs import validation, validation_figures
from tests.study.runs.test_validation import _fake_run


def test_figure_curves_are_the_gaps_of_the_same_seed(tmp_path):
  """The figure's gap series is (loss - loss_bf16) / loss_bf16 of the same seed at each
  step (no smoothing), and the PNG is written."""
  m = validation.Matrix(("bf16", "gemm:mxfp4"), (0, 1))
  for s, (ref, q) in enumerate(((2.0, 2.1), (2.2, 2.2))):
    _fake_run(tmp_path, "bf16", s, ref)
    _fake_run(tmp_path, "gemm:mxfp4", s, q)
  steps, loss, gap = validation_figures.curves(tmp_path, m, smooth=1)
  assert list(steps) == list(range(0, 100, 10))
  assert loss["gemm:mxfp4"].shape == (2, 10)
  np.testing.assert_allclose(gap["gemm:mxfp4"][:, -1], [0.05, 0.0])
  np.testing.assert_allclose(gap["gemm:mxfp4"][:, 0], [0.0, 0.0])
  assert validation_figures.draw(tmp_path, m, skip_steps=0).stat().st_size > 10_000
  with pytest.raises(ValueError, match="no finished bf16 run"):
    validation_figures.curves(tmp_path / "empty", m)


def test_figure_of_runs_shorter_than_the_smoothing_window(tmp_path):
  """Two logged steps (fewer than the 5-point window and all before skip_steps): the
  curves keep one value per step and the figure draws them."""
  m = validation.Matrix(("bf16", "gemm:mxfp4"), (0,))
  for recipe, loss in (("bf16", 2.0), ("gemm:mxfp4", 2.2)):
    run = tmp_path / "runs" / validation.run_name(recipe, 0)
    run.mkdir(parents=True)
    rows = [{"step": s, "loss": loss, "lm_loss": loss} for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.json").write_text("{}")
    (run / "done.json").write_text("{}")
  steps, loss, gap = validation_figures.curves(tmp_path, m)
  assert list(steps) == [1, 2] and loss["gemm:mxfp4"].shape == (1, 2)
  np.testing.assert_allclose(gap["gemm:mxfp4"], [[0.1, 0.1]])
  assert validation_figures.draw(tmp_path, m).stat().st_size > 10_000
