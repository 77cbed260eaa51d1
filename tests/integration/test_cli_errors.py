"""The binaries report bad input, unwritable outputs, full disks and a folder in use in one
line (``error: ...`` on stderr naming the path, exit 2), without a traceback; and a
training run stopped by a full disk keeps its earlier checkpoints verified."""

import os
import pathlib
import signal
import subprocess
import sys

import pytest

ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
TINY = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "configs" / "train_tiny.py"

# Runs a binary (argv[1]) with writes under argv[2] failing: EROFS (read-only file system)
# for files and folders, or ENOSPC from os.fsync ("full").
_SHIM = r"""
import builtins, errno, io, os, runpy, sys
mode, prefix, module = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
sys.argv = [module, *sys.argv[4:]]
def _under(p):
  try:
    return os.path.abspath(os.fspath(p)).startswith(prefix)
  except TypeError:
    return False
def _ro(p):
  raise OSError(errno.EROFS, "Read-only file system", os.fspath(p))
if mode == "readonly":
  _open, _osopen, _mkdir = builtins.open, os.open, os.mkdir
  def open_(f, m="r", *a, **k):
    if _under(f) and any(c in m for c in "wax+"):
      _ro(f)
    return _open(f, m, *a, **k)
  def osopen(p, flags, *a, **k):
    if _under(p) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
      _ro(p)
    return _osopen(p, flags, *a, **k)
  def mkdir(p, *a, **k):
    if _under(p):
      _ro(p)
    return _mkdir(p, *a, **k)
  builtins.open = io.open = open_
  os.open, os.mkdir = osopen, mkdir
else:
  def fsync(fd):
    raise OSError(errno.ENOSPC, "No space left on device")
  os.fsync = fsync
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def run(*args, shim=None, timeout=300):
  cmd = ([sys.executable, "-c", _SHIM, *shim] if shim else [sys.executable, "-m"])
  return subprocess.run([*cmd, *args], env=ENV, capture_output=True, text=True,
                        timeout=timeout)


def assert_one_line(out, *words):
  assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
  # progress lines ("[train] compiling the step...") may come before it: the run's own
  err = [line for line in out.stderr.strip().splitlines() if not line.startswith("[")]
  assert len(err) == 1 and err[0].startswith("error: "), out.stderr[-3000:]
  for w in words:
    assert str(w) in err[0], (w, err[0])


@pytest.fixture(scope="module")
def sweep_out(train_run, tmp_path_factory):
  from fp8jax.study.comparison import sweep  # pylint: disable=import-outside-toplevel

  out = tmp_path_factory.mktemp("cmp")
  sweep.run(train_run, out, policies=["bf16"], steps=[4], floor=False, telemetry=False,
            windows=sweep.Windows(batches=1, batch_size=4, seq_len=16),
            stream=open(os.devnull, "w"))
  return out


def binaries(train_run, sweep_out, tmp_path):
  """{name: (module, args without --out)} of every binary that writes a folder."""
  from tests.data_fixtures import write_c4  # pylint: disable=import-outside-toplevel

  write_c4(tmp_path / "c4", shards_n=1, docs_n=5)
  return {
      "compare": ("fp8jax.experiments.compare", [f"--train_workdir={train_run}",
                                                  "--batches=1", "--batch_size=4",
                                                  "--policies=bf16"]),
      "branch": ("fp8jax.experiments.branch", [f"--train_workdir={train_run}", "--k=1",
                                                "--policies=bf16"]),
      "prepare_data": ("fp8jax.experiments.prepare_data", [f"--input={tmp_path / 'c4'}",
                                                           "--workers=1"]),
      "compare_runs": ("fp8jax.experiments.compare_runs", [f"--runs={train_run},{train_run}"]),
      "formats": ("fp8jax.experiments.formats", ["--quick"]),
      "report": ("fp8jax.experiments.report", [f"--results={sweep_out}"]),
  }


NAMES = ["compare", "branch", "prepare_data", "compare_runs", "formats", "report"]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_an_out_that_is_a_file_or_read_only(name, train_run, sweep_out, tmp_path):
  if name == "prepare_data":
    pytest.importorskip("array_record")
  module, args = binaries(train_run, sweep_out, tmp_path)[name]
  target = tmp_path / "file"
  target.write_text("not a folder")
  assert_one_line(run(module, *args, f"--out={target}"), target, "not a folder")
  ro = tmp_path / "ro"
  ro.mkdir()
  assert_one_line(run(module, *args, f"--out={ro}/out", shim=("readonly", ro)),
                  f"{ro}/out", "read-only file system")


@pytest.mark.slow
def test_compare_on_a_full_disk(train_run, tmp_path):
  out = tmp_path / "cmp"
  got = run("fp8jax.experiments.compare", f"--train_workdir={train_run}", f"--out={out}",
            "--batches=1", "--batch_size=4", "--steps=0", "--policies=bf16", "--nofloor",
            shim=("full", tmp_path))
  assert_one_line(got, out, "no space left on device")


@pytest.mark.slow
def test_train_on_a_full_disk_keeps_its_earlier_checkpoints(tmp_path):
  work = tmp_path / "run"
  shim = r"""
import errno, runpy, sys
import orbax.checkpoint as ocp
save = ocp.CheckpointManager.save
def full(self, step, *a, **k):
  if step >= 4:
    raise OSError(errno.ENOSPC, "No space left on device")
  return save(self, step, *a, **k)
ocp.CheckpointManager.save = full
sys.argv = sys.argv[1:]
runpy.run_module("fp8jax.experiments.train", run_name="__main__", alter_sys=True)
"""
  got = subprocess.run(
      [sys.executable, "-c", shim, "train", f"--workdir={work}", "--config.train.steps=6",
       "--config.train.save_every=2", "--config.data.global_batch=4",
       "--config.data.seq_len=32", "--config.optim.warmup_steps=1"],
      env=ENV, capture_output=True, text=True, timeout=300)
  assert_one_line(got, work / "checkpoints" / "4", "no space left on device")
  verify = run("fp8jax.experiments.verify", f"--workdir={work}")
  assert verify.returncode == 0, verify.stderr
  assert verify.stdout.count(": ok") == 2 and "2 checkpoints, 0 corrupt" in verify.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (["fp8jax.experiments.report", "--results=missing"], ["missing", "meta.json"]),
    (["fp8jax.experiments.train", "--config=missing.py"], ["--config", "missing.py"]),
    (["fp8jax.experiments.train", "--config.train.stesp=20"],
     ["--config.train.stesp=20", "steps"]),
    (["fp8jax.experiments.train", f"--config={TINY}",
      "--config.train.stesp=20"], ["--config.train.stesp=20", "steps"]),
])
def test_bad_command_lines(args, words, tmp_path):
  assert_one_line(run(*args, f"--workdir={tmp_path / 'w'}" if "train" in args[0]
                      else "--top_k=3"), *words)


def test_a_garbage_tokenizer_file_is_named(tmp_path):
  pytest.importorskip("array_record")
  from tests.data_fixtures import write_c4  # pylint: disable=import-outside-toplevel

  write_c4(tmp_path / "c4", shards_n=1, docs_n=5)
  tok = tmp_path / "tokenizer.json"
  tok.write_bytes(b"\xff\xfe garbage \x00")
  got = run("fp8jax.experiments.prepare_data", f"--input={tmp_path / 'c4'}",
            f"--out={tmp_path / 'out'}", f"--tokenizer={tok}")
  assert_one_line(got, tok)


@pytest.mark.slow
def test_a_second_writer_is_refused_in_one_line(train_run, tmp_path):
  from tests.data.test_folder_lock import hold_in_child  # pylint: disable=import-outside-toplevel

  for module, args in (("fp8jax.experiments.train", ["--workdir={}"]),
                       ("fp8jax.experiments.compare", [f"--train_workdir={train_run}", "--out={}",
                                                       "--batches=1", "--policies=bf16"])):
    folder = tmp_path / module.rsplit(".", 1)[1]
    holder = hold_in_child(folder)
    try:
      got = run(module, *(a.format(folder) for a in args))
    finally:
      holder.send_signal(signal.SIGKILL)
      holder.wait()
    assert_one_line(got, folder, "in use by another run", f"pid {holder.pid}")
    assert sorted(p.name for p in folder.iterdir()) == [".lock"]


@pytest.mark.slow
@pytest.mark.parametrize("flag, words", [
    ("--offsets=-1", ["--offsets", ">= 0", "[-1]"]),
    ("--offsets=0,3,0", ["--offsets", "repeat"]),
    ("--batches=0", ["--batches", ">= 1"]),
])
def test_compare_refuses_nonsense_windows(flag, words, train_run, tmp_path):
  from fp8jax.study.comparison import sweep  # pylint: disable=import-outside-toplevel

  got = run("fp8jax.experiments.compare", f"--train_workdir={train_run}",
            f"--out={tmp_path / 'cmp'}", "--policies=bf16", flag)
  assert_one_line(got, *words)
  assert not (tmp_path / "cmp").exists()
  with pytest.raises(ValueError, match=words[0]):
    name, value = flag[2:].split("=")
    sweep.Windows(**{name: tuple(int(v) for v in value.split(","))
                     if name == "offsets" else int(value)})


def test_a_path_too_long_is_one_line():
  from fp8jax.experiments import _cli  # pylint: disable=import-outside-toplevel

  name = "/tmp/" + "x" * 300
  try:
    pathlib.Path(name).mkdir()
  except OSError as e:
    line = _cli.message(e)
  assert line == f"{name}: file name too long (a name over 255 bytes, or a path over the " \
                 "system's limit)"
