"""The binaries keep JAX's persistent compilation cache: where it lives, how to move or turn
it off, and that a second run in a fresh process compiles nothing new."""

import io
import os
import pathlib
import subprocess
import sys
import zlib

import pytest

from fp8jax.train import compile_cache

REPO = pathlib.Path(__file__).resolve().parents[2]

# A binary (through _cli.run) that compiles two functions, then prints the cache events.
_BINARY = r"""
import atexit, collections, sys
import jax, jax.numpy as jnp
from jax import monitoring
from fp8jax.experiments import _cli
events = collections.Counter()
monitoring.register_event_listener(lambda name, **kw: events.update([name]))
atexit.register(lambda: print("hits", events["/jax/compilation_cache/cache_hits"],
                              "misses", events["/jax/compilation_cache/cache_misses"]))
def main(argv):
  x = jnp.arange(64.0).reshape(8, 8)
  y = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(0))(x)
  print(float(jax.jit(jax.grad(lambda a: jnp.sin(a).sum()))(y).sum()))
_cli.run(main)
"""


def _env(**extra):
  env = {k: v for k, v in os.environ.items()
         if k not in (compile_cache.ENV, compile_cache.JAX_ENV,
                      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
  return {**env, "JAX_PLATFORMS": "cpu", **extra}


def _run(*args, **env):
  out = subprocess.run([sys.executable, "-c", _BINARY, *args], env=_env(**env),
                       capture_output=True, text=True, timeout=300, cwd=REPO)
  assert out.returncode == 0, out.stderr[-3000:]
  hits, misses = out.stdout.split()[-3::2]
  return int(hits), int(misses)


def _entries(folder: pathlib.Path) -> set[str]:
  return {p.name for p in folder.rglob("*") if p.is_file() and not p.name.endswith("-atime")
          and p.name != compile_cache.CHECKED}


@pytest.mark.slow
def test_a_rerun_in_a_fresh_process_compiles_nothing(tmp_path):
  cache = tmp_path / "cache"
  hits, misses = _run(f"--compile_cache={cache}")
  assert hits == 0 and misses >= 2  # the two functions (and jnp's ops), each compiled
  first = _entries(cache)
  assert len(first) >= misses
  assert _run(f"--compile_cache={cache}") == (misses, 0)  # each read back, none compiled
  assert _entries(cache) == first


@pytest.mark.slow
def test_the_environment_moves_it_and_off_turns_it_off(tmp_path):
  hits, misses = _run(**{compile_cache.ENV: str(tmp_path / "env")})
  assert hits == 0 and misses >= 2 and _entries(tmp_path / "env")
  assert _run(f"--compile_cache={tmp_path / 'env'}") == (misses, 0)
  assert _run("--compile_cache=off", **{compile_cache.ENV: str(tmp_path / "off")}) == (0, 0)
  assert not (tmp_path / "off").exists()
  # The default folder follows XDG_CACHE_HOME.
  assert _run(XDG_CACHE_HOME=str(tmp_path / "xdg")) == (0, misses)
  assert _entries(tmp_path / "xdg" / "fp8jax" / "jax_cache")


@pytest.mark.parametrize("flag, environ, want", [
    (None, {}, "/home/u/.cache/fp8jax/jax_cache"),
    (None, {"XDG_CACHE_HOME": "/xdg"}, "/xdg/fp8jax/jax_cache"),
    (None, {compile_cache.JAX_ENV: "/j"}, "jax"),
    (None, {compile_cache.JAX_ENV: "/j", compile_cache.ENV: "/f"}, "/f"),
    ("/flag", {compile_cache.JAX_ENV: "/j", compile_cache.ENV: "/f"}, "/flag"),
    ("off", {compile_cache.ENV: "/f"}, None),
    ("", {compile_cache.ENV: "OFF"}, None),
])
def test_resolve_order(flag, environ, want, monkeypatch):
  monkeypatch.setenv("HOME", "/home/u")
  assert compile_cache.resolve(flag, environ) == want


def test_importing_changes_nothing():
  code = ("import jax; before = jax.config.jax_compilation_cache_dir; "
          "import fp8jax.train.compile_cache, fp8jax.experiments._cli; "
          "assert jax.config.jax_compilation_cache_dir == before")
  subprocess.run([sys.executable, "-c", code], env=_env(), check=True, timeout=120)


@pytest.mark.slow
def test_the_training_binary_reruns_without_compiling(tmp_path):
  """Two tiny training runs in fresh processes (other workdirs, one cache): the second
  writes no cache entry and says its step compiled."""
  cache = tmp_path / "cache"
  args = [sys.executable, "-m", "fp8jax.experiments.train",
          f"--config={REPO / 'experiments/configs/train_tiny.py'}",
          "--config.model_overrides.num_hidden_layers=2", "--config.data.seq_len=32",
          "--config.data.global_batch=4", "--config.train.steps=2",
          "--config.optim.warmup_steps=1", f"--compile_cache={cache}"]
  entries = []
  for run in ("first", "second"):
    out = subprocess.run([*args, f"--workdir={tmp_path / run}"], env=_env(),
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[train] compiled the step in" in out.stderr
    entries.append(_entries(cache))
  assert len(entries[0]) >= 3 and entries[1] == entries[0]


def _entry(folder: pathlib.Path, name: str, data: bytes, mtime: float | None = None):
  for path, content in ((folder / f"{name}-cache", data), (folder / f"{name}-atime", b"t")):
    path.write_bytes(content)
    if mtime is not None:
      os.utime(path, (mtime, mtime))


def test_repair_removes_entries_cut_short_once_each(tmp_path):
  from jax._src import compilation_cache as jcc  # pylint: disable=import-outside-toplevel

  whole = jcc.compress_executable(zlib.compress(os.urandom(4000)) * 3)
  _entry(tmp_path, "good", whole)
  _entry(tmp_path, "cut", whole[: len(whole) // 2])  # a write stopped by a full disk
  _entry(tmp_path, "empty", b"")
  out = io.StringIO()
  assert sorted(compile_cache.repair(tmp_path, out)) == ["cut-cache", "empty-cache"]
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      compile_cache.CHECKED, "good-atime", "good-cache"]
  assert out.getvalue().count("\n") == 1 and "removed 2 damaged entries" in out.getvalue()
  # Only entries written since the last check are read again.
  old = (tmp_path / compile_cache.CHECKED).stat().st_mtime - 60
  _entry(tmp_path, "old", b"", mtime=old)
  _entry(tmp_path, "new", whole[:10])
  out = io.StringIO()
  assert compile_cache.repair(tmp_path, out) == ["new-cache"]
  assert (tmp_path / "old-cache").exists() and "removed 1 damaged entry " in out.getvalue()
  assert compile_cache.repair(tmp_path / "missing", out) == []


@pytest.mark.slow
def test_a_cache_damaged_by_a_full_disk_heals_at_the_next_run(tmp_path):
  cache = tmp_path / "cache"
  hits, misses = _run(f"--compile_cache={cache}")
  for entry in cache.glob("*-cache"):  # every entry cut short, as a full disk leaves them
    entry.write_bytes(entry.read_bytes()[:100])
  out = subprocess.run([sys.executable, "-c", _BINARY, f"--compile_cache={cache}"],
                       env=_env(), capture_output=True, text=True, timeout=300, cwd=REPO)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"removed {misses} damaged entries" in out.stderr
  assert "Error reading persistent compilation cache" not in out.stderr
  assert out.stdout.split()[-3::2] == ["0", str(misses)]  # compiled again, written whole
  assert _run(f"--compile_cache={cache}") == (misses, 0)
