"""Seeds trained as one group, the step vmapped over seeds (fp8jax.train.seed_group), and
the validation matrix's group mode."""

import json

import numpy as np
import pytest

from fp8jax.study.runs import validation
from fp8jax.train import loop, run_config, seed_group
from tests.helpers import held_elsewhere


def _config(steps=4, policy="attn@0-2:e4m3"):
  c = run_config.defaults()
  c.model = "tiny"
  c.policy = policy
  c.data.global_batch, c.data.seq_len = 2, 32
  c.optim.warmup_steps = 1
  c.train.steps, c.train.log_every = steps, 2
  c.train.checkpoints = False
  c.train.noise_probe_every = 2
  return c


def _rows(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_group_logs_what_separate_runs_log(tmp_path):
  """Two seeds as a group against seed 3 trained alone: the same rows (keys; losses,
  norms and probe values to BF16 compute's rounding: a vmapped GEMM may sum in another
  order) and config.json with the seed; the seeds' runs differ."""
  cfg = _config()
  out = seed_group.train_seeds(cfg, {3: tmp_path / "g3", 0: tmp_path / "g0"})
  assert sorted(out) == [0, 3] and out[3]["final_step"] == 4
  alone = cfg.copy_and_resolve_references()
  alone.seed = 3  # the group's second member (index 1 of the stacked seeds [0, 3])
  loop.train(alone, tmp_path / "s3")
  got, want = _rows(tmp_path / "g3" / "metrics.jsonl"), _rows(tmp_path / "s3" / "metrics.jsonl")
  assert [r["step"] for r in got] == [r["step"] for r in want] == [2, 4]
  for g, w in zip(got, want):
    assert set(g) == set(w)
    for key in w:
      if key.startswith(("loss", "lm_loss", "grad_norm", "weight_norm/", "probe/grad")):
        assert g[key] == pytest.approx(w[key], rel=1e-3), key
    # The noise is a difference of two gradients: compare it on the gradient's scale.
    assert abs(g["probe/noise_norm"] - w["probe/noise_norm"]) < 1e-3 * w["probe/grad_norm"]
    assert g["probe/ratio"] == pytest.approx(g["probe/grad_norm"] / g["probe/noise_norm"])
  for seed in (0, 3):
    saved = json.loads((tmp_path / f"g{seed}" / "config.json").read_text())
    assert saved["seed"] == seed and saved["policy"] == "attn@0-2:e4m3"
  assert (_rows(tmp_path / "g0" / "metrics.jsonl")[-1]["loss"]
          != _rows(tmp_path / "g3" / "metrics.jsonl")[-1]["loss"])


def test_group_refuses_what_it_cannot_train(tmp_path):
  cfg = _config()
  cfg.train.checkpoints = True
  with pytest.raises(ValueError, match="without checkpoints"):
    seed_group.train_seeds(cfg, {0: tmp_path / "a"})
  cfg = _config()
  cfg.precision.loss_scale = "dynamic"
  with pytest.raises(ValueError, match="loss_scale"):
    seed_group.check(cfg)
  with pytest.raises(ValueError, match="no seeds"):
    seed_group.train_seeds(_config(), {})


def test_a_nonfinite_step_names_its_seed():
  m = {"finite_groups": {"params": {"w": np.array([True, True])},
                         "grads": {"w": np.array([True, False])}}}
  with pytest.raises(loop.NonFiniteError, match=r"seeds \[5\].*grads/w"):
    seed_group._stop(7, m, [3, 5], np.array([True, False]))


def test_matrix_trains_each_recipes_free_seeds_as_one_group(tmp_path):
  """Group mode: one call per recipe with its unfinished seeds that no other process holds;
  a finished seed is not retrained, a held one is skipped as busy; done.json names the
  group; a config with checkpoints is refused before any run."""
  m = validation.Matrix(("bf16", "gemm:mxfp4"), (0, 1, 2))
  calls = []

  def fake(cfg, workdirs, stream=None):
    calls.append((cfg.policy, sorted(workdirs)))
    for s, d in workdirs.items():
      assert d.name == validation.run_name(cfg.policy, s)
      d.joinpath("metrics.jsonl").write_text(json.dumps({"step": 2, "loss": 1.0}) + "\n")
    return {s: {"final_step": 2} for s in workdirs}

  done = tmp_path / "runs" / validation.run_name("bf16", 1)
  done.mkdir(parents=True)
  (done / validation.DONE).write_text("{}")
  with held_elsewhere(tmp_path / "runs" / validation.run_name("gemm:mxfp4", 2)):
    outcome = validation.run_matrix(_config(), tmp_path, m, train_fn=fake, group_seeds=True)
  assert calls == [("bf16", [0, 2]), ("gemm:mxfp4", [0, 1])]
  assert outcome["busy"] == ["gemm_mxfp4_s2"]
  assert sorted(outcome["done"]) == ["bf16_s0", "bf16_s1", "bf16_s2", "gemm_mxfp4_s0",
                                     "gemm_mxfp4_s1"]
  record = json.loads((tmp_path / "runs" / "gemm_mxfp4_s1" / validation.DONE).read_text())
  assert record["group"] == [0, 1] and record["final_step"] == 2
  cfg = _config()
  cfg.train.checkpoints = True
  with pytest.raises(ValueError, match="without checkpoints"):
    validation.run_matrix(cfg, tmp_path / "other", m, train_fn=fake, group_seeds=True)
