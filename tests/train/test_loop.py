"""The training run: end to end on the tiny model, resume, non-finite stop, bad input."""

import io
import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

from fp8jax.train import faults, loop, metrics_log, run_config

REPO = pathlib.Path(__file__).resolve().parents[2]


def small_config(**train):
  c = run_config.defaults()
  c.data.seq_len, c.data.global_batch = 32, 4
  c.optim.peak_lr, c.optim.warmup_steps, c.optim.total_steps = 3e-3, 2, 6
  c.train.steps, c.train.save_every, c.train.log_every = 6, 3, 1
  c.train.update(train)
  return c


def losses(workdir):
  return [(r["step"], r["loss"]) for r in metrics_log.read_rows(workdir / "metrics.jsonl")]


@pytest.mark.slow
def test_run_writes_checkpoints_metrics_and_config(tmp_path):
  out = io.StringIO()
  summary = loop.train(small_config(), tmp_path, stream=out)
  assert summary["final_step"] == 6
  lines = out.getvalue().splitlines()  # the step's compilation, said once, then its steps
  assert lines[0] == "[train] compiling the step..."
  assert re.fullmatch(r"\[train\] compiled the step in \d+\.\d s \(with its first run\)",
                      lines[1]), lines[1]
  assert lines[2].startswith("[train] step 1/6") and "compil" not in "".join(lines[2:])
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                if p.name.isdigit()) == [0, 3, 6]
  rows = metrics_log.read_rows(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
  for key in ("loss", "lm_loss", "aux_loss", "grad_norm", "lr", "tokens_per_s"):
    assert all(isinstance(r[key], float) for r in rows), key
  assert rows[0]["lr"] == 0.0 and rows[2]["lr"] == pytest.approx(3e-3)
  assert rows[-1]["loss"] < rows[0]["loss"]
  assert any(k.startswith("weight_norm/") for k in rows[0])
  assert json.loads((tmp_path / "config.json").read_text())["train"]["steps"] == 6


@pytest.mark.slow
def test_refuses_to_overwrite_and_resumes_exactly(tmp_path):
  full, part = tmp_path / "full", tmp_path / "part"
  loop.train(small_config(), full)
  loop.train(small_config(steps=3), part)
  with pytest.raises(FileExistsError, match="--resume"):
    loop.train(small_config(), part)
  with pytest.raises(ValueError, match=r"differs .* in \['train.moe_impl'\]"):
    loop.train(small_config(moe_impl="reference"), part, resume=True)
  loop.train(small_config(), part, resume=True)
  assert losses(part) == losses(full)


@pytest.mark.slow
def test_resume_messages_name_the_finished_step_the_shrunk_steps_and_a_corrupt_config(
    tmp_path):
  c = small_config(steps=2, save_every=2)
  loop.train(c, tmp_path)
  last = losses(tmp_path)[-1][1]
  out = io.StringIO()
  summary = loop.train(c, tmp_path, resume=True, stream=out)
  assert summary["already_finished"] and summary["final_loss"] == last
  assert f"already finished at step 2 (last logged loss {last:.6g} at step 2)" in out.getvalue()
  files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")
           if p.is_file() and p.name != ".lock"}  # the lock records its latest holder
  with pytest.raises(ValueError, match=r"train.steps 1, but the run in .* has reached step 2"):
    loop.train(small_config(steps=1, save_every=2), tmp_path, resume=True)
  assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")
          if p.is_file() and p.name != ".lock"} == files
  config = tmp_path / "config.json"
  text = config.read_text().splitlines()
  config.write_text("\n".join(text[:3] + ["  garbage"] + text[3:]))
  with pytest.raises(ValueError, match=rf"^{config}:4: not valid JSON"):
    loop.train(c, tmp_path, resume=True)


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_save_then_resume_is_bit_identical(tmp_path):
  """A run killed with SIGKILL while checkpoint 8 is being written (FP8JAX_FAULT) leaves no
  checkpoint 8; resumed, it logs the same losses and saves the same states, bit for bit.
  Resumed again, it says it is already finished, with its last loss."""
  args = [sys.executable, "-m", "fp8jax.experiments.train",
          f"--config={REPO / 'experiments/configs/train_tiny.py'}",
          "--config.model_overrides.num_hidden_layers=2", "--config.data.seq_len=32",
          "--config.data.global_batch=4", "--config.train.steps=12",
          "--config.train.save_every=4", "--config.train.log_every=1",
          "--config.optim.warmup_steps=2"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  subprocess.run([*args, f"--workdir={tmp_path / 'full'}"], env=env, check=True,
                 capture_output=True, timeout=600)
  killed = tmp_path / "killed"
  proc = subprocess.run([*args, f"--workdir={killed}"], capture_output=True, timeout=600,
                        env={**env, faults.ENV: "checkpoint_save/8@1"})
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
  assert not (killed / "checkpoints" / "8").exists()
  assert [s for s, _ in losses(killed)][-1] == 7  # step 8 is logged after its save
  resumed = subprocess.run([*args, f"--workdir={killed}", "--resume"], env=env,
                           capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resuming from checkpoint 4" in resumed.stderr
  assert losses(killed) == losses(tmp_path / "full") and len(losses(killed)) == 12
  for step in (8, 12):
    digests = [json.loads((w / "checkpoints" / str(step) / "meta" / "metadata").read_text())[
        "digests"] for w in (killed, tmp_path / "full")]
    assert digests[0] == digests[1], step
  again = subprocess.run([*args, f"--workdir={killed}", "--resume"], env=env,
                         capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  last = losses(killed)[-1][1]
  assert again.stdout.startswith(f"done: the run was already finished at step 12, last loss "
                                 f"{last}; nothing to do"), again.stdout


@pytest.mark.slow
def test_nonfinite_stops_naming_step_and_group_and_keeps_checkpoints(tmp_path):
  c = small_config(save_every=1)
  c.optim.peak_lr, c.optim.warmup_steps = 1e30, 0  # the first update blows the weights up
  with pytest.raises(loop.NonFiniteError, match=r"step 2: .*first non-finite: grads/") as e:
    loop.train(c, tmp_path)
  assert "last good checkpoint: step 1" in str(e.value)
  steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [0, 1]
  assert [r["step"] for r in metrics_log.read_rows(tmp_path / "metrics.jsonl")] == [1]


@pytest.mark.slow
@pytest.mark.parametrize("check_update", [False, True])
def test_an_update_that_overflows_the_weights_is_never_saved(tmp_path, check_update):
  """Finite loss and gradients, an update that sends the weights to inf: the run stops
  at step 1 naming the parameter, by default before saving the step (the update was
  applied), with check_update before applying it."""
  c = small_config(save_every=1)
  c.optim.peak_lr, c.optim.warmup_steps, c.optim.weight_decay = 1e37, 0, 1e10
  c.precision.check_update = check_update
  said = (r"step 1: non-finite .*first non-finite: new_params/.*without applying" if check_update
          else r"step 1: its update made new_params/\S+ non-finite .*without saving it")
  with pytest.raises(loop.NonFiniteError, match=said) as e:
    loop.train(c, tmp_path)
  assert "last good checkpoint: step 0" in str(e.value)
  steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [0]


@pytest.mark.slow
def test_fp8_policy_trains_and_differs_from_bf16(tmp_path):
  bf16 = loop.train(small_config(steps=3), tmp_path / "bf16")
  c = small_config(steps=3)
  c.policy = "attn@0-2:e5m2+moe@1-2:e5m2"
  fp8 = loop.train(c, tmp_path / "fp8")
  assert fp8["final_loss"] == pytest.approx(bf16["final_loss"], rel=0.05)
  assert fp8["final_loss"] != bf16["final_loss"]


@pytest.mark.parametrize("change, error", [
    (lambda c: c.train.update(stepz=3), "unknown config keys \\['train.stepz'\\]"),
    (lambda c: setattr(c, "model", "gpt5"), "unknown model 'gpt5'"),
    (lambda c: c.model_overrides.update(vocab=3), "unknown model_overrides keys"),
    (lambda c: setattr(c, "policy", "attn@7:e4m3"), "names layer 7"),
    (lambda c: setattr(c, "policy", "moe@0:e4m3"), "layer 0, which is a dense layer"),
    (lambda c: c.data.update(source="hf:c4"), "source"),
    (lambda c: c.data.update(source="tfds:c4/en:3.1.0", data_dir="/nonexistent/tfds"),
     "/nonexistent/tfds"),
    (lambda c: c.model_overrides.update(vocab_size=200), "257.*200|200.*257"),
    (lambda c: c.data.update(seq_len=4096), "max_position_embeddings"),
    (lambda c: c.update(optim={"total_steps": 0}, train={"steps": -5}),  # schedule follows
     r"^train.steps must be >= 1, got -5$"),
    (lambda c: c.data.update(global_batch=0), r"^data.global_batch must be >= 1, got 0$"),
])
def test_bad_input_fails_before_compute(tmp_path, change, error):
  c = small_config()
  change(c)
  with pytest.raises((ValueError, FileNotFoundError), match=error):
    loop.train(c, tmp_path)
  assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_resume_skips_a_torn_last_checkpoint(tmp_path):
  loop.train(small_config(), tmp_path / "full")
  part = tmp_path / "part"
  loop.train(small_config(steps=6), part)
  state_dir = part / "checkpoints" / "6" / "state"
  for f in state_dir.rglob("*"):
    if f.is_file():
      f.write_bytes(b"")  # a save the kill cut short
  c = small_config(steps=6)
  c.optim.total_steps = 6
  loop.train(c, part, resume=True)
  assert (part / "checkpoints" / "6.incomplete").exists()
  assert losses(part) == losses(tmp_path / "full")


@pytest.mark.slow
def test_tensorboard_scalars(tmp_path):
  c = small_config(steps=2, save_every=2, tensorboard=True)
  loop.train(c, tmp_path)
  events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  assert events and events[0].stat().st_size > 100


@pytest.mark.slow
def test_a_run_without_checkpoints_is_not_overwritten_or_resumed(tmp_path):
  """A second run in the workdir of one that saved no checkpoint is refused like one in a
  run with checkpoints (even with another seed), and --resume says it cannot resume;
  nothing it wrote changes."""
  cfg = small_config(steps=2, log_every=1, checkpoints=False)
  loop.train(cfg, tmp_path)
  def written():  # the folder's lock records its last holder
    return {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and
            p.name != ".lock"}

  before = written()
  assert len(metrics_log.read_rows(tmp_path / "metrics.jsonl")) == 2
  cfg.seed = 1
  with pytest.raises(FileExistsError, match="saved no checkpoint .its metrics.jsonl has rows"):
    loop.train(cfg, tmp_path)
  with pytest.raises(ValueError, match="saved no checkpoint .train.checkpoints=False., so it "
                                       "cannot be resumed"):
    loop.train(cfg, tmp_path, resume=True)
  assert written() == before
