"""scripts/bench/fusion_bytes.py: a profile's kernels matched to the HLO instructions of an
XLA dump, with the bytes those move counted from their shapes."""

import gzip
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))
import fusion_bytes  # noqa: E402

PROGRAM = """
import jax, jax.numpy as jnp
f = jax.jit(lambda x: (x.astype(jnp.float8_e4m3fn).T.astype(jnp.float32) * 2).sum(0))
f(jnp.ones((256, 128), jnp.float32)).block_until_ready()
"""


@pytest.mark.slow
def test_kernels_get_their_instructions_bytes(tmp_path):
  dump = tmp_path / "dump"
  proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                        check=False, env={**os.environ, "JAX_PLATFORMS": "cpu",
                                          "XLA_FLAGS": f"--xla_dump_to={dump} "
                                                       "--xla_dump_hlo_as_text"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  modules = fusion_bytes.instructions(dump)
  lam = next(m for name, m in modules.items() if "lambda" in name)
  # The largest fusion reads the [256, 128] float32 input (128 KiB) and writes a result of
  # at most that size (its transpose, or less): more than 128 KiB and at most 256.
  biggest = max((v for k, v in lam.items() if not k.startswith("_") and v["op"] == "fusion"),
                key=lambda v: v["bytes"])
  assert 256 * 128 * 4 < biggest["bytes"] <= 2 * 256 * 128 * 4, biggest
  name = next(k for k, v in lam.items() if v is biggest)
  events = [{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}},
            {"ph": "X", "pid": 7, "name": name, "dur": 1000.0},   # 1 ms, twice
            {"ph": "X", "pid": 7, "name": name, "dur": 1000.0},
            {"ph": "X", "pid": 8, "name": name, "dur": 5e6}]      # not a GPU event
  trace = tmp_path / "trace.json.gz"
  trace.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
  ms = fusion_bytes.kernel_ms(trace)
  assert ms == {name: 2.0}
  assert fusion_bytes.best_module(ms, modules) == next(k for k in modules if "lambda" in k)
  [row] = fusion_bytes.table(ms, lam, steps=2, top=5)
  assert row["ms_per_step"] == 1.0 and row["instances"] == 1
  assert row["gb_per_s"] == round(biggest["bytes"] / 1e-3 / 1e9)
