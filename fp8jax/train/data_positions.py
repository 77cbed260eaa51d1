"""Every process's data position in a checkpoint: an Orbax item of one JSON file per process.

In a multi-process run each process reads its own share of the data, and a streaming
source's position differs between processes. The ``positions`` item of a training
checkpoint holds ``process_<i>-of-<n>.json`` for each process ``i`` of ``n`` (each process
writes its own file, as grain's Orbax handler does); Orbax finalises the step only when
every process has written, so a step folder either has all of them or does not exist.

A restore reads this process's file. A run resumed with another number of processes gets
the position only if all saved positions are the same (a global position, as the in-memory
sources keep); otherwise :class:`ProcessCountError` names both counts.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from etils import epath
import jax
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
