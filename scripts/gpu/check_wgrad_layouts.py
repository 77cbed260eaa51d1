"""GPU check: the grouped blockwise Wgrad kernel on operands in the rows' layout.

    python scripts/gpu/check_wgrad_layouts.py   # with $OUT: $OUT/check_wgrad_layouts.json

At the 2B expert shapes (``bench/_moe_problem.py``: 16384 tokens x top 7, d 1280, f 896,
63 experts, groups padded to 128 rows) X and dY are quantized for Wgrad as
``gemm:fp32_blockwise`` does (1 x 128 tiles along the tokens), once transposed (X^T, dY^T:
``transpose.quantize_swapped``) and once in place (``transpose.quantize_columns``), and
``grouped_scaled_wgrad`` runs on each (``rows_first`` for the second). Reports whether the
two dW agree bit for bit (and their largest difference), and median times of the
quantization plus kernel and of the kernel alone for each layout; then, per layout, the
kernel with its products on the FP8 tensor cores (``fp8_dots``): time, and the share of
dW bit-equal to the bfloat16 products' and their relative difference.
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
from fp8jax.gemm import padding, transpose  # noqa: E402
from fp8jax.kernels import grouped_scaled_pallas as gsp  # noqa: E402


def main():
  p = moe_problem(16384)
  ids = p["ids"].reshape(-1)
  e = p["gate"].shape[0]
  order = jnp.argsort(ids, stable=True)
  sizes = jnp.bincount(ids, length=e).astype(jnp.int32)
  x, _ = padding.pad_groups(jnp.repeat(p["x"], 7, axis=0)[order], sizes, 128)
  dy = jax.random.normal(jax.random.key(9), (x.shape[0], p["gate"].shape[2]), jnp.float32)
  dy, padded = padding.pad_groups(dy[:ids.shape[0]], sizes, 128)
  cfg = fp8jax.recipe("fp32_blockwise")
  ri, rg = cfg.roles.input, cfg.roles.grad

  def quant(rows_first):
    q = transpose.quantize_columns if rows_first else transpose.quantize_swapped
    return jax.jit(lambda a, b: (q(a, ri), q(b, rg)))

  def kernel(rows_first, fp8_dots=False):
    return jax.jit(lambda a, b: gsp.grouped_scaled_wgrad(
        a.data, a.scale_inv, b.data, b.scale_inv, padded, groups_aligned=True,
        rows_first=rows_first, convert_in_kernel=True, fp8_dots=fp8_dots))

  out, dws = {"device": jax.devices()[0].device_kind, "rows": int(x.shape[0])}, {}
  for rows_first in (False, True):
    name = "rows_first" if rows_first else "transposed"
    q, k = quant(rows_first), kernel(rows_first)
    ops = q(x, dy)
    dws[name] = np.asarray(k(*ops))
    both = jax.jit(lambda a, b, q=q, k=k: k(*q(a, b)))
    t_all, all_times = median_time(both, [(x, dy)], runs=10)
    t_k, k_times = median_time(k, [ops], runs=10)
    out[name] = {"quantize_and_kernel_ms": t_all * 1e3, "kernel_ms": t_k * 1e3,
                 "times_all": all_times, "times_kernel": k_times}
    try:  # the products on the FP8 tensor cores, against the bfloat16 ones
      k8 = kernel(rows_first, fp8_dots=True)
      dw8 = np.asarray(k8(*ops))
      t8, times8 = median_time(k8, [ops], runs=10)
      out[f"{name}_fp8_dots"] = {
          "kernel_ms": t8 * 1e3, "times_kernel": times8,
          "equal_fraction": float(np.mean(dw8 == dws[name])),
          "rel_diff": float(np.linalg.norm(dw8 - dws[name]) / np.linalg.norm(dws[name]))}
    except Exception as err:  # noqa: BLE001 - a layout Triton's FP8 MMA does not take
      out[f"{name}_fp8_dots"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
  a, b = dws["transposed"], dws["rows_first"]
  out["bit_equal"] = bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))
  out["max_abs_diff"] = float(np.max(np.abs(a - b)))
  out["rel_diff"] = float(np.linalg.norm(a - b) / np.linalg.norm(a))
  out["nans"] = int(np.isnan(b).sum())
  print(json.dumps({k: (v if not isinstance(v, dict) else
                        {n: round(t, 3) if isinstance(t, float) else t
                         for n, t in v.items() if not n.startswith("times")})
                    for k, v in out.items()}, indent=1))
  if os.environ.get("OUT"):
    pathlib.Path(os.environ["OUT"], "check_wgrad_layouts.json").write_text(
        json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
