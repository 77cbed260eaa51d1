"""Append-only JSONL results that survive a kill: whole-line appends, torn-line repair."""

from __future__ import annotations

import json
import os
import pathlib

from fp8jax.train import faults, metrics_log


def append(path, row: dict) -> None:
  """Appends ``row`` as one line with a single write, flushed to disk."""
  line = json.dumps(row) + "\n"
  with metrics_log.writing(path), open(path, "a") as f:
    if faults.reached(f"append/{pathlib.Path(path).name}"):  # the kill tests only
      f.write(line[: len(line) // 2])
      f.flush()
      os.fsync(f.fileno())
      faults.kill()
    f.write(line)
    f.flush()
    os.fsync(f.fileno())


def read(path) -> list[dict]:
  """The complete rows of a JSONL file ([] if it does not exist)."""
  path = pathlib.Path(path)
  return metrics_log.read_rows(path) if path.exists() else []


def rewrite(path, rows) -> None:
  """Replaces the file's content atomically (temp file + rename)."""
  path = pathlib.Path(path)
  tmp = path.with_name(path.name + ".tmp")
  with metrics_log.writing(tmp):
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
  tmp.replace(path)


def write_json(path, obj) -> None:
  """Writes ``obj`` as indented JSON, atomically (temp file + rename)."""
  path = pathlib.Path(path)
  tmp = path.with_name(path.name + ".tmp")
  with metrics_log.writing(tmp):
    tmp.write_text(json.dumps(obj, indent=2))
  tmp.replace(path)


def repair(path, keep=lambda row: True) -> list[dict]:
  """Drops a torn last line and the rows ``keep`` rejects; returns the rows kept."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  rows = [r for r in read(path) if keep(r)]
  rewrite(path, rows)
  return rows
