"""``train.eval_precision``: the loss of every logged batch at the params before its update,
in the model's BF16 baseline or in the run's policy, against forwards taken here on the
checkpointed params; the record of which one a run used."""

import io
import json
from typing import NamedTuple

import jax
import numpy as np
import pytest

from fp8jax.train import checkpoint as ckpt_lib
from fp8jax.train import evaluation, loop, run_config, seed_group
from fp8jax.train import mesh as mesh_lib

POLICY = "attn@0-1:e5m2+gemm:mxfp8"  # a site and a GEMM recipe: both change the forward


def _config(precision, steps=2, policy=POLICY, **train):
  c = run_config.defaults()
  c.model_overrides.num_hidden_layers = 2
  c.policy = policy
  c.data.seq_len, c.data.global_batch = 16, 2
  c.optim.warmup_steps = 1
  c.train.steps, c.train.save_every, c.train.log_every = steps, 1, 1
  c.train.eval_precision = precision
  c.train.update(train)
  return c


def _rows(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _batches(cfg, n):
  data = loop.make_data(cfg, mesh_lib.data_mesh(jax.devices()[:1]),
                        run_config.model(cfg).vocab_size)
  return [np.asarray(next(data)) for _ in range(n)]


def _forward(model, policy):
  def losses(params, tokens):
    logits, aux = model.apply(params, tokens, policy)
    lm = model.loss(logits, tokens)
    return lm + aux.get("aux_loss", 0.0), lm
  return jax.jit(losses)


class _State(NamedTuple):
  params: int
  delayed: dict


def test_logged_steps_the_pre_update_state_and_the_config_checks():
  seen = []

  def step(state, tokens):
    return _State(state.params + 1, {}), {"loss": state.params}

  def evaluate(params, delayed, tokens):
    seen.append(params)
    return {"eval/lm_loss": -params}

  run = evaluation.Evaluated(step, evaluate, start=0, total=5, log_every=2)
  state, logged = _State(0, {}), []
  for _ in range(5):
    state, m = run(state, "batch")
    logged.append(m)
  assert [m.get("eval/lm_loss") for m in logged] == [None, -1, None, -3, -4]
  assert seen == [1, 3, 4]  # logged steps 2, 4 and the last: the params each then updates
  assert [m["loss"] for m in logged] == [0, 1, 2, 3, 4]
  c = _config("fp16")
  with pytest.raises(ValueError, match=r"train.eval_precision must be one of \('', 'train', "
                                       r"'bf16'\).*got 'fp16'"):
    run_config.check(c)
  c.train.eval_precision = "bf16"
  model, policy = run_config.check(c)
  assert evaluation.policy_for("bf16", model, policy) is model.baseline
  assert evaluation.policy_for("train", model, policy) is policy
  assert evaluation.policy_for("", model, policy) is None
  saved = json.loads(c.to_json())
  assert (evaluation.precision_of(saved), evaluation.column("lm_loss", saved)) == (
      "bf16", "eval/lm_loss")
  saved["train"]["eval_precision"] = "train"
  assert (evaluation.precision_of(saved), evaluation.column("loss", saved)) == (
      "train", "eval/loss")
  for old in ({"train": {"eval_precision": ""}}, {"train": {}}, {}):  # none, or before it
    assert (evaluation.precision_of(old), evaluation.column("lm_loss", old)) == (
        "train", "lm_loss")


@pytest.mark.slow
def test_the_eval_loss_is_a_separate_forward_of_the_checkpointed_params_bit_for_bit(
    tmp_path):
  """BF16 evaluation: each logged step's eval/lm_loss and eval/loss equal, bit for bit, the
  BF16 forward of that step's batch on the params of the checkpoint before it; "train":
  the same forward in the run's policy. The two differ (the policy changes the forward),
  the BF16 run's training loss is logged beside it, and the checkpoints record which."""
  got = {}
  for precision in ("bf16", "train"):
    cfg = _config(precision)
    workdir = tmp_path / precision
    loop.train(cfg, workdir, stream=io.StringIO(), devices=jax.devices()[:1])
    model, policy = run_config.check(cfg)
    forward = _forward(model, model.baseline if precision == "bf16" else policy)
    ckpt = ckpt_lib.Checkpointer(workdir / "checkpoints", 1)
    like = ckpt_lib.abstract_like(model.init(jax.random.key(0)))
    rows, batches = _rows(workdir), _batches(cfg, 2)
    assert [r["step"] for r in rows] == [1, 2]
    for row, tokens in zip(rows, batches):
      params, _ = ckpt.restore_params(row["step"] - 1, like)
      loss, lm = jax.device_get(forward(params, tokens))
      assert (row["eval/loss"], row["eval/lm_loss"]) == (float(loss), float(lm)), precision
    ckpt.close()
    for step in (0, 2):
      assert ckpt_lib.saved_meta(workdir / "checkpoints", step)["eval_precision"] == precision
    got[precision] = rows
  bf16, low = got["bf16"], got["train"]
  assert bf16[0]["eval/lm_loss"] != low[0]["eval/lm_loss"]  # same params and batch at step 1
  assert low[0]["eval/lm_loss"] == pytest.approx(low[0]["lm_loss"], rel=1e-6)
  assert bf16[0]["lm_loss"] == low[0]["lm_loss"]  # both trained in the policy


@pytest.mark.slow
def test_a_seed_group_logs_each_seeds_bf16_eval_loss(tmp_path):
  """With ``--group_seeds`` each seed's rows carry its BF16 evaluation, on step 1 the BF16
  forward of its own initial params (to the rounding of a batched GEMM)."""
  cfg = _config("bf16", steps=2, policy="attn@0-1:e5m2", checkpoints=False)
  dirs = {s: tmp_path / f"s{s}" for s in (0, 1)}
  seed_group.train_seeds(cfg, dirs, stream=io.StringIO())
  model, _ = run_config.check(cfg)
  forward = _forward(model, model.baseline)
  (tokens,) = _batches(cfg, 1)
  for s, workdir in dirs.items():
    rows = _rows(workdir)
    assert [r["step"] for r in rows if "eval/lm_loss" in r] == [1, 2]
    _, lm = jax.device_get(forward(model.init(jax.random.key(s)), tokens))
    assert rows[0]["eval/lm_loss"] == pytest.approx(float(lm), rel=1e-5)
