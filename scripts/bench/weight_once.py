"""Each expert weight quantized once for the grouped GEMM's Fprop and Dgrad.

    python scripts/bench/weight_once.py [--out=FILE.json] [--tokens=16384]

One 2B gate GEMM (``_moe_problem.py``: 16384 tokens x top 7, d 1280, f 896, 63 experts,
groups padded to 128 rows; float32 weights as the model keeps them), forward and backward
(Y, dX, dW) under ``gemm:fp32_blockwise_mma`` and ``gemm:fp32_blockwise``, three ways:

* ``apart``: W^T quantized for Fprop and W for Dgrad, each in the backward pass again (the
  path before ``grouped_operands.weight_once``);
* ``once_read_transposed``: W quantized once in its own layout, kept for the backward pass;
  Fprop's kernel reads it transposed (``fprop_reads_transposed``);
* ``once_swapped``: the same, with XLA swapping the 8-bit payload for Fprop.

Each way's Y, dX and dW must have the bits of ``apart``. Medians of 20 runs
(``_timing.median_time``); on a CPU, a small interpreted problem.
"""

import argparse
import json

from _moe_problem import padded_problem
import _repo  # noqa: F401
from _results import RESULTS, record
from _timing import median_time
import jax
import jax.numpy as jnp
import numpy as np

import fp8jax
from fp8jax.gemm import grouped, grouped_operands


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default="")
  ap.add_argument("--tokens", type=int, default=16384)
  args = ap.parse_args()
  gpu = jax.default_backend() == "gpu"
  runs = 20 if gpu else 2
  x, dy, w, padded, _ = padded_problem(args.tokens, gpu)
  w = w.astype(jnp.float32)
  RESULTS["device"] = jax.devices()[0].device_kind
  weight_once, transposed = grouped_operands.weight_once, grouped_operands.fprop_reads_transposed
  for recipe in ("fp32_blockwise_mma", "fp32_blockwise"):
    cfg = fp8jax.recipe(recipe)
    if not gpu:
      cfg = cfg.replace(impl="pallas")
    outs = {}
    for way, once, read_t in (("apart", False, True), ("once_read_transposed", True, True),
                              ("once_swapped", True, False)):
      grouped_operands.weight_once = weight_once if once else (lambda c: False)
      grouped_operands.fprop_reads_transposed = lambda fp8_dots, r=read_t: r

      def fwd_bwd(x, w, dy, cfg=cfg):
        y, vjp = jax.vjp(lambda a, b: grouped.fp8_ragged_dot(a, b, padded, cfg, 128), x, w)
        return (y, *vjp(dy))

      fn = jax.jit(fwd_bwd)  # traced now, with this way's switches
      outs[way] = [np.asarray(o, np.float32) for o in fn(x, w, dy)]
      t, times = median_time(fn, [(x, w, dy)], runs)
      same = [bool(np.array_equal(u, v)) for u, v in zip(outs[way], outs["apart"])]
      record(f"{recipe}_{way}", ms=t * 1e3, same_y=same[0], same_dx=same[1], same_dw=same[2],
             times=times)
  grouped_operands.weight_once, grouped_operands.fprop_reads_transposed = weight_once, transposed
  if args.out:
    with open(args.out, "w") as f:
      json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
  main()
