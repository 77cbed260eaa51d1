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


def save_figure(fig, path, dpi: int = 100) -> None:
  """Saves a matplotlib figure as ``path`` (its format from the suffix) atomically: a kill
  mid-write leaves the previous file, never a truncated one."""
  path = pathlib.Path(path)
  tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
  try:
    with metrics_log.writing(tmp):
      fig.savefig(tmp, dpi=dpi)
    tmp.replace(path)
  finally:
    tmp.unlink(missing_ok=True)


def repair(path, keep=lambda row: True) -> list[dict]:
  """Drops a torn last line and the rows ``keep`` rejects; returns the rows kept."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  rows = [r for r in read(path) if keep(r)]
  rewrite(path, rows)
  return rows


def read_meta(path, need=()) -> dict:
  """A results folder's ``meta.json`` (a JSON object holding the keys ``need``).

  Raises:
    ValueError: the file is not valid JSON (``file:line:column``), not an object, or lacks
      a key of ``need`` (named).
  """
  path = pathlib.Path(path)
  try:
    meta = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}); the folder's "
                     "meta.json is damaged") from None
  if not isinstance(meta, dict):
    raise ValueError(f"{path}: holds a JSON {type(meta).__name__}, not an object")
  missing = [k for k in need if k not in meta]
  if missing:
    raise ValueError(f"{path}: lacks {missing}")
  return meta


def resumed_meta(folder, meta: dict, keys, what: str, optional=()) -> dict | None:
  """The ``meta.json`` a resumed run finds in ``folder`` (None when there is none), checked
  to agree with this run's ``meta`` on ``keys`` (compared as JSON). A key of ``optional``
  that the old file lacks (written before the key existed) is not compared.

  Raises:
    ValueError: naming the folder, ``what`` it holds and the first key that differs.
  """
  path = pathlib.Path(folder) / "meta.json"
  if not path.exists():
    return None
  old = read_meta(path)
  for key in keys:
    if (key in old or key not in optional) and old.get(key) != json.loads(json.dumps(meta[key])):
      raise ValueError(f"{folder} holds {what} with a different {key} ({old.get(key)} vs "
                       f"{meta[key]}); use another output folder")
  return old
