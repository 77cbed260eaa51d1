"""Run control in one process: SIGTERM preemption and exact resume, the per-process data
positions of a checkpoint, the multi-process environment, and quiet library logs.
(Several processes: tests/integration/test_multihost.py.)"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

from fp8jax.train import data_positions, loop, metrics_log, multihost, preemption, run_config

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


def test_positions_restore_per_process_and_across_process_counts(tmp_path):
  handler = data_positions.PositionsHandler()
  handler.save(tmp_path, data_positions.PositionsSave({"epoch": 0, "step": 5}))
  assert json.loads((tmp_path / "process_0-of-1.json").read_text()) == {"epoch": 0, "step": 5}
  assert handler.restore(tmp_path) == {"epoch": 0, "step": 5}
  # Saved by 2 processes, restored by 1: only a position all of them share.
  two = tmp_path / "two"
  two.mkdir()
  for i, doc in enumerate((10, 10)):
    (two / f"process_{i}-of-2.json").write_text(json.dumps({"doc": doc}))
  assert handler.restore(two) == {"doc": 10}
  (two / "process_1-of-2.json").write_text(json.dumps({"doc": 11}))
  with pytest.raises(data_positions.ProcessCountError, match="saved by 2 processes.*has 1"):
    handler.restore(two)
  (two / "process_1-of-2.json").unlink()
  with pytest.raises(FileNotFoundError, match="no complete set"):
    handler.restore(two)


@pytest.mark.parametrize("env, error", [
    ({"JAX_NUM_PROCESSES": "2"}, "JAX_NUM_PROCESSES is set but JAX_PROCESS_ID is not"),
    ({"JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"}, "JAX_NUM_PROCESSES='two' is not"),
])
def test_initialize_names_a_bad_environment(monkeypatch, env, error):
  for name in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  with pytest.raises(ValueError, match=error):
    multihost.initialize()


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


def test_watch_survives_a_native_library_replacing_its_handler(tmp_path):
  """A C-level SIGTERM handler set behind Python's back (as a native library may) is
  undone at the next step boundary: the notice is caught instead of ending the process."""
  code = (
      "import ctypes, os, signal\n"
      "from fp8jax.train import preemption\n"
      "class Manager:\n"
      "  def reached_preemption(self, step): return False\n"
      "libc = ctypes.CDLL(None)\n"
      "libc.signal.restype = ctypes.c_void_p\n"
      "libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]\n"
      "with preemption.Watch(Manager()) as watch:\n"
      "  libc.signal(signal.SIGTERM, None)  # SIG_DFL, unseen by Python\n"
      "  assert not watch.reached(1)\n"
      "  os.kill(os.getpid(), signal.SIGTERM)\n"
      "  print('caught', watch.reached(2))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
  assert out.stdout.split() == ["caught", "True"]
