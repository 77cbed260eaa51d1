"""GPU check: the FP32-blockwise grouped GEMM in the kernel against its XLA simulation.

    python scripts/gpu/check_grouped_blockwise.py [RECIPE [GROUP_MULTIPLE]]
    # with $OUT: $OUT/check_grouped_blockwise[_RECIPE_MULTIPLE].json

At the 2B expert shapes (16384 tokens x top-7 rows sorted by expert, d 1280, f 896, 63
experts, Zipf-skewed loads; ``bench/_moe_problem.py``), ``fp8_ragged_dot`` under
``gemm:fp32_blockwise`` (or RECIPE; with GROUP_MULTIPLE m > 1 the rows laid out with each
expert padded to m rows, as the model's dispatch does) forward and backward (Y, dX, dW of
the gate GEMM), once as
``fp8jax`` takes it on one GPU (the grouped blockwise-scaled kernel,
``fp8jax.kernels.grouped_scaled_pallas``) and once with the kernels disabled (the XLA
simulation on dequantized float32 operands): relative distance of each output (float32
rounding only), Y of the first expert against a float64 product of the same quantized
operands (the kernel must be no further from it than 2x the XLA path), median times and
the compiled temporaries.
"""

import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
from _moe_problem import moe_problem  # noqa: E402
from _timing import median_time  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fp8jax  # noqa: E402
from fp8jax.gemm import grouped, padding  # noqa: E402
from fp8jax.kernels import placement  # noqa: E402
from fp8jax.quant import qtensor  # noqa: E402


def _deq64(qt) -> np.ndarray:
  """A 2-D QTensor dequantized exactly in float64."""
  data = np.asarray(qt.data.astype(jnp.float32), np.float64)
  s = np.asarray(qt.scale_inv, np.float64)
  for axis, b in enumerate(qt.block[-2:]):
    s = np.repeat(s, b, axis=axis)
  return data * s[:data.shape[0], :data.shape[1]]


def main():
  p = moe_problem(16384)
  ids = p["ids"].reshape(-1)
  order = jnp.argsort(ids, stable=True)
  x = jnp.repeat(p["x"], 7, axis=0)[order]
  sizes = jnp.bincount(ids, length=p["gate"].shape[0]).astype(jnp.int32)
  w = p["gate"]
  name = sys.argv[1] if len(sys.argv) > 1 else "fp32_blockwise"
  multiple = int(sys.argv[2]) if len(sys.argv) > 2 else 1
  cfg = fp8jax.recipe(name)
  dy = jax.random.normal(jax.random.key(9), (x.shape[0], w.shape[2]), jnp.bfloat16)
  if multiple > 1:  # zero rows fill each expert's rows up to a multiple
    x, _ = padding.pad_groups(x, sizes, multiple)
    dy, _ = padding.pad_groups(dy, sizes, multiple)

  def fwd_bwd(x, w, dy):
    y, vjp = jax.vjp(lambda a, b: grouped.fp8_ragged_dot(a, b, sizes, cfg, multiple), x, w)
    return (y, *vjp(dy))

  out, allowed = {}, placement.kernels_allowed
  results = {}
  for path in ("kernel", "xla"):
    if path == "xla":
      placement.kernels_allowed = lambda backend=None: False
    fn = jax.jit(lambda *a: fwd_bwd(*a))  # a new function: no trace shared between paths
    mem = fn.lower(x, w, dy).compile().memory_analysis()
    results[path] = [np.asarray(a, np.float32) for a in fn(x, w, dy)]
    t, times = median_time(fn, [(x, w, dy)], runs=10)
    out[path] = {"ms": t * 1e3, "times": times, "temp_gib": mem.temp_size_in_bytes / 2**30}
    placement.kernels_allowed = allowed
  for what, a, b in zip(("y", "dx", "dw"), results["kernel"], results["xla"], strict=True):
    out[f"rel_{what}"] = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    out[f"nans_{what}"] = int(np.isnan(a).sum())
  # Float64 truth for Y on the first expert's rows: the same quantized operands, dequantized
  # exactly in float64 (payload x scale), multiplied in float64.
  n0 = int(sizes[0])
  xq = qtensor.quantize(x[:n0], cfg.roles.input)
  wq = qtensor.quantize(jnp.swapaxes(w[0], 0, 1), cfg.roles.weight)  # [F, K]
  truth = _deq64(xq) @ _deq64(wq).T
  for path in ("kernel", "xla"):
    got = results[path][0][:n0].astype(np.float64)
    out[f"y_vs_float64_{path}"] = float(np.linalg.norm(got - truth) / np.linalg.norm(truth))
  out["ok"] = all(out[f"nans_{n}"] == 0 and out[f"rel_{n}"] < 1e-3 for n in ("y", "dx", "dw")
                  ) and out["y_vs_float64_kernel"] <= 2 * out["y_vs_float64_xla"] + 1e-7
  out["device"], out["recipe"], out["group_multiple"] = (
      jax.devices()[0].device_kind, name, multiple)
  print(json.dumps({k: v for k, v in out.items() if k not in ("kernel", "xla")}, indent=1))
  print({p: {k: round(v, 3) for k, v in out[p].items() if k != "times"} for p in ("kernel", "xla")})
  if os.environ.get("OUT"):
    tag = "" if (name, multiple) == ("fp32_blockwise", 1) else f"_{name}_{multiple}"
    pathlib.Path(os.environ["OUT"], f"check_grouped_blockwise{tag}.json").write_text(
        json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
