"""scripts/bench/compile_split.py: each stage of the paired evaluation's first call is timed
and recorded, in the loop and with the scan (``--target=train`` times the training step
through the same ``_stages``)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_records_every_stage(tmp_path):
  target = "pair"
  names = ["pair_bf16 scan=False", "pair_gemm:fp32_blockwise scan=False",
           "pair_bf16 scan=True", "pair_gemm:fp32_blockwise scan=True"]
  out = tmp_path / "split.json"
  proc = subprocess.run(
      [sys.executable, "scripts/bench/compile_split.py", f"--target={target}", "--model=tiny",
       "--layers=3", "--batch=1", "--seq=16", "--policies=gemm:fp32_blockwise",
       f"--json={out}"],
      capture_output=True, text=True, cwd=REPO, check=False,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  got = json.loads(out.read_text())
  assert list(got["results"]) == names
  for row in got["results"].values():
    assert all(row[k] > 0 for k in ("trace_s", "lower_s", "compile_s", "hlo_chars"))
  # The scan, unrolled by default, traces one layer per run (tests/models/test_layer_scan.py) but
  # lowers every layer, so the program text is no shorter than the loop's.
