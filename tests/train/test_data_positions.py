"""The per-process data positions of a checkpoint (fp8jax/train/data_positions.py): one file
per process, restored by the same or another process count."""

import json

import pytest

from fp8jax.train import data_positions


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
