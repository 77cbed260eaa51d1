"""Run control in one process: SIGTERM preemption and exact resume, --distributed without a
cluster, and quiet library logs. (The data positions, the multi-process environment and
the SIGTERM watch alone: test_data_positions.py, test_multihost.py, test_preemption.py;
several processes: tests/integration/test_multihost.py.)"""

import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

from fp8jax.train import loop, metrics_log, preemption, run_config

REPO = pathlib.Path(__file__).resolve().parents[2]


def small_config(steps=6):
  c = run_config.defaults()
  c.data.seq_len, c.data.global_batch = 32, 4
  c.optim.peak_lr, c.optim.warmup_steps, c.optim.total_steps = 3e-3, 2, 6
  c.train.steps, c.train.save_every, c.train.log_every = steps, 3, 1
  return c


def losses(workdir):
  return [(r["step"], r["loss"]) for r in metrics_log.read_rows(workdir / "metrics.jsonl")]


@pytest.mark.slow
def test_sigterm_saves_at_the_next_step_and_the_resume_is_exact(tmp_path, monkeypatch):
  loop.train(small_config(), tmp_path / "full")
  make_data, reads = loop.make_data, []

  def data_with_a_sigterm(*args, **kwargs):
    data = make_data(*args, **kwargs)

    class Data:
      def __next__(self):
        reads.append(1)
        if len(reads) == 3:  # while step 2 runs (the next batch is read ahead)
          os.kill(os.getpid(), signal.SIGTERM)
        return next(data)

      def __getattr__(self, name):
        return getattr(data, name)

    return Data()

  monkeypatch.setattr(loop, "make_data", data_with_a_sigterm)
  before = signal.getsignal(signal.SIGTERM)
  part = tmp_path / "part"
  with pytest.raises(preemption.Preempted, match="saved checkpoint 2") as e:
    loop.train(small_config(), part)
  assert e.value.step == 2 and signal.getsignal(signal.SIGTERM) is before
  steps = sorted(int(p.name) for p in (part / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [0, 2]  # 2 is not a regular save (every 3 steps)
  assert [s for s, _ in losses(part)] == [1, 2]
  monkeypatch.setattr(loop, "make_data", make_data)
  loop.train(small_config(), part, resume=True)
  assert losses(part) == losses(tmp_path / "full")


@pytest.mark.slow
def test_distributed_without_a_cluster_or_environment_says_what_to_set(tmp_path):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                              "SLURM_", "OMPI_", "TPU_", "KUBERNETES_"))}
  out = subprocess.run([sys.executable, "-m", "fp8jax.experiments.train", "--distributed",
                        f"--workdir={tmp_path}"], env={**env, "JAX_PLATFORMS": "cpu"},
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 2, out.stderr[-3000:]
  assert "error: --distributed: " in out.stderr and "set JAX_COORDINATOR_ADDRESS" in out.stderr
  assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_binaries_keep_library_info_logs_off_the_terminal(tmp_path):
  args = [sys.executable, "-m", "fp8jax.experiments.train",
          f"--config={REPO / 'tests' / 'integration' / 'multihost_config.py'}",
          "--config.train.steps=2"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  quiet = subprocess.run([*args, f"--workdir={tmp_path / 'quiet'}"], env=env, text=True,
                         capture_output=True, timeout=600)
  assert quiet.returncode == 0, quiet.stderr[-3000:]
  lines = quiet.stderr.splitlines() + quiet.stdout.splitlines()
  train = [line.split("  ")[0] for line in lines if line.startswith("[train]")]
  assert train[0] == "[train] compiling the step..." and train[1].startswith(
      "[train] compiled the step in ") and train[2:] == ["[train] step 1/2", "[train] step 2/2"]
  assert lines[-1].startswith("done: step 2")
  assert not [line for line in lines if re.match(r"I\d{4} ", line)]  # no INFO log line
  assert len(lines) <= 5 + 3, lines  # progress, the summary, a handful of warnings at most
  loud = subprocess.run([*args, f"--workdir={tmp_path / 'loud'}", "--verbosity=0"], env=env,
                        text=True, capture_output=True, timeout=600)
  assert loud.returncode == 0, loud.stderr[-3000:]
  assert "checkpoint_manager.py" in loud.stderr  # Orbax's INFO lines
