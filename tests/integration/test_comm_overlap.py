"""scripts/bench/comm_overlap.py: a GPU's collective time hidden behind its other kernels,
on a hand-made perfetto trace whose answer is worked out below."""

import gzip
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))
import comm_overlap  # noqa: E402


def _trace(path, events):
  meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}}]
  kernels = [{"ph": "X", "pid": pid, "tid": 0, "name": n, "ts": ts, "dur": dur}
             for pid, n, ts, dur in events]
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": meta + kernels}, f)
  return path


def test_hidden_and_exposed_collective_time(tmp_path):
  # GPU 0, microseconds: compute 0-1000 and 800-1500 (one busy stretch 0-1500, on two
  # streams), 3000-4000; ncclAllReduce 1200-2200 (300 hidden, 700 exposed) and
  # ncclReduceScatter 3500-3700 (all hidden). Host events are not the GPU's.
  trace = _trace(tmp_path / "t.json.gz", [
      (1, "fusion_1", 0, 1000), (1, "gemm_2", 800, 700), (1, "fusion_3", 3000, 1000),
      (1, "ncclDevKernel_AllReduce_Sum_f32", 1200, 1000),
      (1, "ncclDevKernel_ReduceScatter", 3500, 200), (2, "ncclHostThing", 0, 9999)])
  rows = comm_overlap.report(trace, steps=1)
  assert list(rows) == ["/device:GPU:0"]
  assert rows["/device:GPU:0"] == {
      "collective_ms": 1.2, "hidden_ms": 0.5, "exposed_ms": 0.7,
      "compute_busy_ms": 2.5, "span_ms": 4.0, "collectives": 2.0}
  halves = comm_overlap.report(trace, steps=2)["/device:GPU:0"]
  assert halves["exposed_ms"] == pytest.approx(0.35) and halves["collectives"] == 1.0
