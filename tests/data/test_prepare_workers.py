"""prepare_data's worker processes end with their parent: SIGKILL of the parent mid-run
leaves no worker (nor multiprocessing's resource tracker) running, and a rerun gives the
data of an uninterrupted run."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tests.data_fixtures import write_c4

pytest.importorskip("array_record", reason="prepared data needs array-record (data extra)")


def children(pid: int) -> list[int]:
  """The live descendants of ``pid`` (from /proc)."""
  parents = {}
  for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if fields[0] != "Z":
      parents[int(stat.parent.name)] = int(fields[1])
  out, frontier = [], [pid]
  while frontier:
    p = frontier.pop()
    kids = [c for c, pp in parents.items() if pp == p]
    out += kids
    frontier += kids
  return out


def alive(pid: int) -> bool:
  try:
    state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
  except OSError:
    return False
  return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_a_killed_parent_and_the_rerun_matches(tmp_path):
  write_c4(tmp_path / "c4", shards_n=6, docs_n=3000)
  args = [sys.executable, "-m", "fp8jax.experiments.prepare_data",
          f"--input={tmp_path / 'c4'}", "--workers=2"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  out = tmp_path / "killed"
  proc = subprocess.Popen([*args, f"--out={out}"], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 120
    while not list((out / "tokens").glob("*.tmp")) or len(children(proc.pid)) < 3:
      assert proc.poll() is None and time.time() < deadline, "the job ended before the kill"
      time.sleep(0.01)
    kids = children(proc.pid)  # two workers and the resource tracker
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.wait()
  deadline = time.time() + 5
  while any(alive(k) for k in kids) and time.time() < deadline:
    time.sleep(0.05)
  left = [k for k in kids if alive(k)]
  for k in left:
    os.kill(k, signal.SIGKILL)
  assert not left, f"processes left running after the parent's SIGKILL: {left}"
  assert not (out / "manifest.json").exists()
  for folder in (out, tmp_path / "full"):
    done = subprocess.run([*args, f"--out={folder}"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
  full, again = (json.loads((f / "manifest.json").read_text()) for f in (tmp_path / "full", out))
  assert again["hash"] == full["hash"] and again["documents"] == 6 * 2999
