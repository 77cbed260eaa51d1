"""The validation matrix (``fp8jax.study.runs.matrix``): its recipes read before any run
starts."""

import pytest

from fp8jax.train import run_config


def test_the_validation_matrix_reads_recipes_as_the_runs_model_does(tmp_path):
  """A rules recipe is a recipe of the matrix; the run config's model reads every recipe
  before any run: DeepSeek-MoE's site grammar is refused for a Llama, with no run started."""
  from fp8jax.study.runs import matrix as matrix_lib
  cfg = run_config.defaults()
  cfg.model, cfg.optim.warmup_steps = "llama:tiny", 1
  trained = []

  def fake_train(cfg, workdir, resume, stream):
    del resume, stream
    trained.append((cfg.policy, workdir.name))
    return {"final_step": cfg.train.steps}

  ok = matrix_lib.Matrix(("bf16", r"gemm:mxfp8@layers/\d+/mlp/.*"), (0,))
  matrix_lib.run_matrix(cfg, tmp_path / "ok", ok, train_fn=fake_train)
  assert [p for p, _ in trained] == ["bf16", r"gemm:mxfp8@layers/\d+/mlp/.*"]
  trained.clear()
  with pytest.raises(ValueError, match="bad policy term 'attn@0:e4m3'"):
    matrix_lib.run_matrix(cfg, tmp_path / "bad", matrix_lib.Matrix(("bf16", "attn@0:e4m3"),
                                                                    (0,)),
                          train_fn=fake_train)
  assert not trained
