"""One writer per output folder (fp8jax.data.folder_lock): a second writer fails at once
naming the holder, a killed holder's lock is recovered, nested use in one thread does not
deadlock, and train, the sweep, branch, the study and prepare_data take the lock."""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from fp8jax.data import folder_lock
from fp8jax.train import multihost

REPO = pathlib.Path(__file__).resolve().parents[2]

_HOLD = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("folder_lock", sys.argv[2])
folder_lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(folder_lock)
with folder_lock.hold(sys.argv[1]):
  print("held", flush=True)
  time.sleep(600)
"""
"""A child holding a folder's lock: ``folder_lock`` loaded alone from its file (it needs only
the standard library; importing the ``fp8jax`` package would take seconds of JAX)."""


def _hold_args(folder) -> list[str]:
  return [sys.executable, "-c", _HOLD, str(folder), folder_lock.__file__]


def hold_in_child(folder):
  """A child process holding ``folder``'s lock (started, and holding, on return)."""
  proc = subprocess.Popen(_hold_args(folder), stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "held\n"
  return proc


@pytest.fixture
def held(tmp_path):
  folder = tmp_path / "out"
  proc = hold_in_child(folder)
  yield folder, proc
  if proc.poll() is None:
    proc.kill()
  proc.wait()


def test_a_second_writer_fails_at_once_naming_the_holder(held):
  folder, proc = held
  t0 = time.perf_counter()
  with pytest.raises(folder_lock.FolderLockedError) as err:
    with folder_lock.hold(folder):
      pass
  assert time.perf_counter() - t0 < 2
  msg = str(err.value)
  assert "\n" not in msg and str(folder) in msg
  assert f"host {socket.gethostname()}, pid {proc.pid}, started 20" in msg


def test_a_killed_holders_lock_is_recovered(held):
  folder, proc = held
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  with folder_lock.hold(folder):
    assert folder_lock.holder(folder)["pid"] == os.getpid()


def test_nested_use_in_one_thread_and_refusal_in_another(tmp_path):
  folder = tmp_path / "out"
  errors = []

  def other_thread():
    try:
      with folder_lock.hold(folder):
        pass
    except folder_lock.FolderLockedError as e:
      errors.append(str(e))

  with folder_lock.hold(folder):
    with folder_lock.hold(folder):  # the same thread again: no deadlock, no refusal
      with folder_lock.hold(folder / "sub"):
        pass
    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert errors and "another thread of this process" in errors[0]
    proc = subprocess.run(_hold_args(folder), capture_output=True, text=True, timeout=60)
    assert "FolderLockedError" in proc.stderr  # still held after the nested release
  with folder_lock.hold(folder):  # released by the outermost
    pass


def test_only_process_0_of_a_run_takes_the_lock(held, monkeypatch):
  folder, _ = held
  monkeypatch.setattr(multihost, "is_main", lambda: False)
  with multihost.lock_folder(folder):  # another process of a run: process 0 holds it
    pass
  with multihost.lock_folder(held[0].parent / "new"):
    assert not (held[0].parent / "new").exists()
  monkeypatch.setattr(multihost, "is_main", lambda: True)
  with pytest.raises(folder_lock.FolderLockedError):
    with multihost.lock_folder(folder):
      pass


@pytest.mark.slow
def test_writers_take_the_lock(held, train_run, tmp_path):
  from fp8jax.study import pipeline  # pylint: disable=import-outside-toplevel
  from fp8jax.study.branches import branch  # pylint: disable=import-outside-toplevel
  from fp8jax.study.comparison import sweep  # pylint: disable=import-outside-toplevel
  from fp8jax.train import loop, run_config  # pylint: disable=import-outside-toplevel

  folder, _ = held
  cfg = run_config.defaults()
  cfg.data.seq_len, cfg.data.global_batch, cfg.train.steps = 32, 4, 2
  cfg.optim.warmup_steps = 1
  calls = {
      "train": lambda: loop.train(cfg, folder),
      "sweep": lambda: sweep.run(train_run, folder, policies=["bf16"], floor=False,
                                 windows=sweep.Windows(batches=1, batch_size=4)),
      "branch": lambda: branch.run(train_run, folder, policies=["bf16"], from_steps=[0],
                                   branches=branch.Branches(k=1)),
      "study": lambda: pipeline.run_study(cfg, folder),
  }
  for name, call in calls.items():
    with pytest.raises(folder_lock.FolderLockedError, match="in use by another run"):
      call()
    assert sorted(p.name for p in folder.iterdir()) == [".lock"], name  # nothing written


def test_prepare_data_takes_the_lock(held, tmp_path):
  pytest.importorskip("array_record")
  from fp8jax.data import prepare  # pylint: disable=import-outside-toplevel
  from tests.data_fixtures import write_c4  # pylint: disable=import-outside-toplevel

  folder, _ = held
  write_c4(tmp_path / "c4", shards_n=1, docs_n=5)
  with pytest.raises(folder_lock.FolderLockedError):
    prepare.prepare([str(tmp_path / "c4")], folder, "bytes", workers=1,
                    log=open(os.devnull, "w"))
  assert not (folder / "plan.json").exists()
