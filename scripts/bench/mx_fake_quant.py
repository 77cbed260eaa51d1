"""MX / NVFP4 fake-quant bandwidth, side by side with the FP8 kernel and a copy, one run.

    python scripts/bench/mx_fake_quant.py                  # bf16 [16384, 7168]
    python scripts/bench/mx_fake_quant.py --rows 256 --cols 1024 --runs 3 --reps 2   # CPU

Each function is jitted, warmed up and timed as the median over ``--runs`` runs of
``--reps`` back-to-back calls on 3 rotating inputs (``_timing.median_time``). GB/s count the
minimum traffic of a one-pass round trip, a bf16 read and a bf16 write (4 bytes per
element); "% copy" divides by the copy kernel's GB/s measured in the same run. NVFP4's
two-level scale needs the tensor's amax before any block is scaled, so it reads the input
twice: its floor is 6 bytes per element, at most 4/6 = 67% of copy on this count, and the
table also gives the share of copy on the 6 bytes it must move.

Checks on the device (in the JSON): the Pallas kernel (``*_auto``: what ``fake_quant``
takes; ``nvfp4_kernel``: called directly) against the fused XLA path, elements that differ
(MX scales are exponent arithmetic and must agree; NVFP4's divide), the fused NVFP4/MXFP4
against the payload path (``quantize_dequantize``) bit for bit, and no output holds a NaN
after a poisoned buffer (an element never written). With ``$OUT`` set, writes
``$OUT/mx_fake_quant.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _repo  # noqa: E402,F401
from _results import RESULTS, record  # noqa: E402
from _timing import count_nans, median_time, poisoned  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fp8jax  # noqa: E402
from fp8jax.kernels import fake_quant_pallas as fqp  # noqa: E402
from fp8jax.quant import fused_round_trip, qtensor  # noqa: E402


def _bits_equal(a, b) -> int:
  """Elements whose bits differ (NaN patterns included)."""
  a = np.asarray(jnp.asarray(a, jnp.float32)).view(np.uint32)
  b = np.asarray(jnp.asarray(b, jnp.float32)).view(np.uint32)
  return int(np.sum(a != b))


def main():
  cpu = jax.default_backend() == "cpu"
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--rows", type=int, default=256 if cpu else 16384)
  p.add_argument("--cols", type=int, default=1024 if cpu else 7168)
  p.add_argument("--runs", type=int, default=3 if cpu else 25)
  p.add_argument("--reps", type=int, default=2 if cpu else 20)
  a = p.parse_args()
  shape = (a.rows, a.cols)
  xs = [jax.random.normal(jax.random.key(i), shape, jnp.bfloat16) * 3 for i in range(3)]
  key = jax.random.key(7)
  kernel_ok = not cpu and fqp.auto_applies(shape, jnp.bfloat16, fp8jax.preset("mxfp8"))

  fns = {
      "copy": jax.jit(lambda x: -x),
      "amax_only": jax.jit(lambda x: jnp.max(jnp.abs(x.astype(jnp.float32)))),
      "fp8_1x128_kernel": jax.jit(lambda x: fp8jax.fake_quant(x, fp8jax.preset("deepseek_v3"))),
      "mxfp8_auto": jax.jit(lambda x: fp8jax.fake_quant(x, fp8jax.preset("mxfp8"))),
      "mxfp8_xla": jax.jit(lambda x: fused_round_trip.quantize_dequantize_fused(
          x, fp8jax.preset("mxfp8"))),
      "mxfp4_auto": jax.jit(lambda x: fp8jax.fake_quant(x, fp8jax.preset("mxfp4"))),
      "mxfp4_xla": jax.jit(lambda x: fused_round_trip.quantize_dequantize_fused(
          x, fp8jax.preset("mxfp4"))),
      # NVFP4 in the kernel, called directly: fake_quant leaves two-level scales to XLA.
      "nvfp4_kernel": jax.jit(lambda x: fqp.fake_quant_pallas(
          x, fp8jax.preset("nvfp4"), interpret=cpu, **fqp.auto_config(fp8jax.preset("nvfp4")))),
      "nvfp4_xla": jax.jit(lambda x: fused_round_trip.quantize_dequantize_fused(
          x, fp8jax.preset("nvfp4"))),
      "nvfp4_sr_xla": jax.jit(lambda x: fused_round_trip.quantize_dequantize_fused(
          x, fp8jax.preset("nvfp4_sr"), key)),
  }
  n = a.rows * a.cols
  one_pass = 4 * n
  times = {}
  for name, fn in fns.items():
    med, per = median_time(fn, [(x,) for x in xs], a.runs, a.reps)
    times[name] = med
    bytes_moved = 2 * n if name == "amax_only" else one_pass
    record(name, seconds=med, gbps=bytes_moved / med / 1e9, times=per)
  copy_gbps = one_pass / times["copy"] / 1e9
  for name in fns:
    if name in ("copy", "amax_only"):
      continue
    row = RESULTS[name]
    row["pct_copy"] = 100 * row["gbps"] / copy_gbps
    if name.startswith("nvfp4"):  # two passes: 6 bytes per element must move
      row["pct_copy_of_two_pass_traffic"] = 100 * (6 * n / times[name] / 1e9) / copy_gbps
    print(f"{name}: {row['pct_copy']:.1f}% of copy"
          + (f", {row['pct_copy_of_two_pass_traffic']:.1f}% on 6 B/elem"
             if "pct_copy_of_two_pass_traffic" in row else ""), flush=True)

  x = xs[0]
  checks = {"pallas_kernel_used_for_mxfp8": bool(kernel_ok)}
  for name, path in (("mxfp8", "auto"), ("mxfp4", "auto"), ("nvfp4", "kernel")):
    checks[f"{name}_{path}_vs_xla_diffs"] = _bits_equal(fns[f"{name}_{path}"](x),
                                                        fns[f"{name}_xla"](x))
  for name in ("mxfp4", "nvfp4"):
    ref = qtensor.quantize_dequantize(x, fp8jax.preset(name))
    checks[f"{name}_fused_vs_payload_diffs"] = _bits_equal(fns[f"{name}_xla"](x), ref)
  checks["poison_nans"] = {name: count_nans(poisoned(fn, x)) for name, fn in fns.items()
                           if name not in ("copy", "amax_only")}
  print(json.dumps(checks, indent=1), flush=True)
  out = os.environ.get("OUT")
  if out:
    payload = {"device": str(jax.devices()[0].device_kind), "shape": list(shape),
               "dtype": "bfloat16", "runs": a.runs, "reps": a.reps,
               "copy_gbps": copy_gbps, "results": RESULTS, "checks": checks}
    pathlib.Path(out, "mx_fake_quant.json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
  main()
