"""GPU check: MX and NVFP4 round trips on the device against the same computation on CPU.

    python scripts/gpu/check_mx.py                 (with $OUT set: $OUT/check_mx.npz)
    python scripts/gpu/check_mx.py --compare=DIR   (on a CPU machine: DIR/check_mx.npz)

On the GPU it writes, for every MX/NVFP4 preset, the dequantized round trip of fixed inputs
(NumPy-seeded bf16 and float32 tensors with outlier rows, NaN, inf and all-zero blocks) and
the payload bits and scales of ``fp8jax.quantize``. With ``--compare`` it recomputes the
same on the CPU and counts the elements whose bits differ per preset, as JSON on stdout.
Power-of-two (MX) scales are exponent arithmetic and must agree exactly; NVFP4's
two-level scales take float32 divisions, which GPUs do not round correctly, so their
differences are measured, not assumed.
"""

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import _repo  # noqa: E402,F401
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import fp8jax  # noqa: E402

PRESETS = ("mxfp8", "mxfp8_ocp", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4",
           "mxfp4_rceil", "nvfp4", "nvfp4_weight")


def inputs() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(2026)
  x = rng.standard_normal((128, 512)).astype(np.float32)
  x *= 2.0 ** rng.integers(-20, 12, size=(128, 1))  # rows in many binades
  x[::37] *= 300.0  # outlier rows
  x[5, 7], x[9, 100], x[11, 3] = np.nan, np.inf, -np.inf
  x[13, :64] = 0.0
  return {"f32": x, "bf16": x.astype(ml_dtypes.bfloat16)}


def compute() -> dict[str, np.ndarray]:
  out = {}
  for tag, x in inputs().items():
    xj = jnp.asarray(x)
    for name in PRESETS:
      spec = fp8jax.preset(name)
      qt = jax.jit(lambda v, spec=spec: fp8jax.quantize(v, spec))(xj)
      out[f"{tag}/{name}/xhat"] = np.asarray(
          jax.jit(lambda v, spec=spec: fp8jax.fake_quant(v, spec))(xj).astype(jnp.float32))
      out[f"{tag}/{name}/data"] = np.asarray(qt.data.astype(jnp.float32))
      out[f"{tag}/{name}/scale_inv"] = np.asarray(qt.scale_inv.astype(jnp.float32))
      if qt.tensor_scale_inv is not None:
        out[f"{tag}/{name}/tensor_scale_inv"] = np.asarray(qt.tensor_scale_inv)
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--compare", default="")
  a = p.parse_args()
  if not a.compare:
    res = compute()
    out = os.environ.get("OUT", ".")
    np.savez_compressed(pathlib.Path(out) / "check_mx.npz", **res)
    print(f"{jax.devices()[0].device_kind}: {len(res)} arrays written", flush=True)
    return
  gpu = np.load(pathlib.Path(a.compare) / "check_mx.npz")
  cpu = compute()
  report = {}
  for k, v in cpu.items():
    g, c = gpu[k].astype(np.float32), v.astype(np.float32)
    same = (g.view(np.uint32) == c.view(np.uint32)) | (np.isnan(g) & np.isnan(c))
    report[k] = int(np.sum(~same))  # NaN payload bits may differ by platform
  bad = {k: v for k, v in report.items() if v}
  print(json.dumps({"arrays": len(report), "arrays_with_differences": bad}, indent=1))


if __name__ == "__main__":
  main()
