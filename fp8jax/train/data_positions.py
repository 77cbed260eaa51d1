"""Every process's data position in a checkpoint: an Orbax item of one JSON file per process.

In a multi-process run each process reads its own share of the data, and a streaming
source's position differs between processes. The ``positions`` item of a training
checkpoint holds ``process_<i>-of-<n>.json`` for each process ``i`` of ``n`` (each process
writes its own file, as grain's Orbax handler does); Orbax finalises the step only when
every process has written, so a step folder either has all of them or does not exist.

A restore reads this process's file. A run resumed with another number of processes gets
the position only if all saved positions are the same (a global position, as the in-memory
sources keep); otherwise :class:`ProcessCountError` names both counts.

Every position is covered by the checkpoint's digests like the arrays: a save records
:func:`record` (``{file name: digest}`` of every process's position) in the checkpoint's
``meta``, and every restore and ``verify`` checks each positions file, and the copy of
process 0's position in the ``data`` item, against it (:func:`check`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import re
from typing import Any

from etils import epath
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

ITEM = "positions"
"""The item's name in a checkpoint step folder."""

_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


class ProcessCountError(ValueError):
  """The checkpoint's per-process positions differ and the process count changed."""


def _name(index: int, count: int) -> str:
  return f"process_{index}-of-{count}.json"


class PositionsHandler(ocp.CheckpointHandler):
  """Saves this process's position dict; restores it (see the module docstring)."""

  def save(self, directory: epath.Path, args: PositionsSave):
    path = epath.Path(directory) / _name(jax.process_index(), jax.process_count())
    path.write_text(json.dumps(args.position))

  def restore(self, directory: epath.Path, args: PositionsRestore | None = None) -> dict:
    del args
    directory = epath.Path(directory)
    mine = directory / _name(jax.process_index(), jax.process_count())
    if mine.exists():
      return json.loads(mine.read_text())
    saved = {}
    for path in directory.iterdir():
      match = _FILE.fullmatch(path.name)
      if match:
        saved[int(match[1])] = (int(match[2]), json.loads(path.read_text()))
    counts = {count for count, _ in saved.values()}
    if len(counts) != 1 or sorted(saved) != list(range(next(iter(counts)))):
      raise FileNotFoundError(f"{directory} lacks {mine.name} and holds no complete set of "
                              f"per-process positions (found {sorted(saved)})")
    count = counts.pop()
    positions = [position for _, position in saved.values()]
    if any(p != positions[0] for p in positions):
      raise ProcessCountError(
          f"the checkpoint in {directory.parent} was saved by {count} processes whose data "
          f"positions differ (a streaming source); this run has {jax.process_count()}: "
          f"resume it with {count} processes")
    return positions[0]

  def metadata(self, directory: epath.Path) -> Any:
    del directory
    return None

  def finalize(self, directory: epath.Path) -> None:
    del directory

  def close(self) -> None:
    pass


@ocp.args.register_with_handler(PositionsHandler, for_save=True)
@dataclasses.dataclass
class PositionsSave(ocp.args.CheckpointArgs):
  position: dict


@ocp.args.register_with_handler(PositionsHandler, for_restore=True)
@dataclasses.dataclass
class PositionsRestore(ocp.args.CheckpointArgs):
  pass


def restore(manager: ocp.CheckpointManager, step: int, fallback: dict) -> dict:
  """This process's data position at ``step``; ``fallback`` (the position of process 0,
  the ``data`` item) for checkpoints written before the ``positions`` item existed."""
  if not (epath.Path(manager.directory) / str(step) / ITEM).exists():
    return fallback
  return manager.restore(step, args=ocp.args.Composite(**{ITEM: PositionsRestore()}))[ITEM]


def digest(position) -> str:
  """16 hex digits of the SHA-256 of a position's canonical JSON (sorted keys)."""
  text = json.dumps(position, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def record(position: dict) -> dict[str, str]:
  """``{positions file name: digest}`` of every process's position (every process calls
  it with its own, at the same save)."""
  mine = np.frombuffer(bytes.fromhex(digest(position)), np.uint8)
  count = jax.process_count()
  every = (mine[None] if count == 1
           else np.asarray(multihost_utils.process_allgather(mine)).reshape(count, -1))
  return {_name(i, count): bytes(d).hex() for i, d in enumerate(every.astype(np.uint8))}


def _file_digest(path: pathlib.Path) -> str:
  try:
    return digest(json.loads(path.read_text()))
  except FileNotFoundError:
    return "(missing)"
  except (OSError, ValueError):
    return "(unreadable)"


def check(step_dir, recorded: dict | None, data_item=None) -> tuple[str, str, str] | None:
  """``(file, digest found, digest recorded)`` of the first positions file of checkpoint
  folder ``step_dir`` (or, given ``data_item``, the position copy in its ``data`` item,
  which is process 0's) that differs from ``recorded`` (:func:`record`); None when all
  match or nothing was recorded (checkpoints written before position digests)."""
  if not recorded:
    return None
  step_dir = pathlib.Path(step_dir)
  for name, want in sorted(recorded.items()):
    path = step_dir / ITEM / name
    found = _file_digest(path)
    if found != want:
      return str(path), found, want
  if data_item is not None:
    want = recorded.get(_name(0, len(recorded)))
    found = digest(data_item)
    if want is not None and found != want:
      return str(step_dir / "data" / "metadata"), found, want
  return None
