"""Grouped-GEMM benchmark at the 2B MoE shapes: the Pallas kernels against XLA.

    python scripts/bench/grouped_gemm.py                  # GPU: checks, kernel sweep, MoE layer
    python scripts/bench/grouped_gemm.py     # on CPU: the checks only, 64 tokens (interpreter)

Shapes: d = 1280, f = 896 (853 true), 63 experts, top-7 of T tokens (16384 by default),
Zipf-skewed routing (max/mean expert load ~2.7) as in ``study_perf.py --parts=moe``.

0. Ceiling: a bf16 [8192, 8192] x [8192, 8192] matmul, timed like the kernels.
1. Checks: each Pallas kernel (forward, Dgrad, Wgrad, and the forward under ``vmap``) against
   ``padded_grouped_matmul`` in float32 on the same bf16 inputs, as ||out - ref|| / ||ref|| (bf16
   operands: expect ~1e-3), after filling the output memory with NaN (a NaN means an
   element was never written).
2. Kernel sweep: each kernel alone for several block shapes, median ms and TFLOP/s over
   the routed rows (2 * N * d * f).
3. The MoE layer forward + backward (``moe.experts_dispatch``, gradients of x and the three
   expert weights) with the tiled XLA GEMM and with the Pallas GEMM, routed TFLOP/s
   counting 3 x 2 x T x k x 3 x d x 853, and its fraction of the ceiling.

Times: medians over ``--reps`` runs of 5 back-to-back calls after warm-up (each run
synchronised with ``block_until_ready``), per call. With ``$OUT`` set, writes
``$OUT/grouped_gemm_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _moe_problem import F_TRUE, moe_problem  # noqa: E402
import _repo  # noqa: E402,F401
from _results import RESULTS, record  # noqa: E402
from _timing import median_time, poisoned  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fp8jax.gemm import grouped as grouped_gemm  # noqa: E402
from fp8jax.kernels import grouped_matmul_triton as gmp  # noqa: E402
from fp8jax.models import moe  # noqa: E402

_FWD_SWEEP = "128x128x64w8s3,128x256x64w8s3,128x256x64w8s4,256x128x64w8s3,128x256x32w8s4," \
             "256x128x64w8s4,128x128x64w4s4,64x256x64w4s4,128x256x64w4s3"
_WGRAD_SWEEP = "128x128x32w4s4,256x128x32w8s3,128x256x32w8s3,128x128x64w4s4,256x128x64w8s3," \
               "128x256x64w8s3,256x256x32w8s3"


def parse_blocks(text: str) -> list[gmp.Blocks]:
  """``"128x128x64w8s3,..."`` -> Blocks(m, n, k, num_warps, num_stages) per entry."""
  out = []
  for item in filter(None, text.split(",")):
    mnk, rest = item.split("w")
    warps, stages = rest.split("s")
    m, n, k = map(int, mnk.split("x"))
    out.append(gmp.Blocks(m, n, k, int(warps), int(stages)))
  return out


def tag(b: gmp.Blocks) -> str:
  return f"{b.m}x{b.n}x{b.k}w{b.num_warps}s{b.num_stages}"


def rel_err(out, ref):
  out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
  if not np.all(np.isfinite(out)):
    return float("nan")
  return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def checks(p, interpret: bool):
  flat = p["ids"].reshape(-1)
  order = jnp.argsort(flat, stable=True)
  xs = jnp.take(p["x"], order // p["ids"].shape[1], axis=0)
  sizes = jnp.bincount(flat, length=p["gate"].shape[0]).astype(jnp.int32)
  dys = jax.random.normal(jax.random.key(9), (xs.shape[0], p["gate"].shape[2]), jnp.bfloat16)
  f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
  hi = jax.default_matmul_precision("highest")
  with hi:
    ref_fwd = grouped_gemm.padded_grouped_matmul(f32(xs), f32(p["gate"]), sizes)
    padded = grouped_gemm.padded_grouped_matmul
    ref_dgrad = padded(f32(dys), jnp.swapaxes(f32(p["gate"]), 1, 2), sizes)
    _, vjp = jax.vjp(lambda w: padded(f32(xs), w, sizes), f32(p["gate"]))
    ref_wgrad = vjp(f32(dys))[0]
  fwd = jax.jit(lambda a, w, s: gmp.rows_matmul(a, w, s, interpret=interpret))
  dgrad = jax.jit(lambda a, w, s: gmp.rows_matmul(a, w, s, transpose_w=True,
                                                  interpret=interpret))
  wgr = jax.jit(lambda a, b, s: gmp.wgrad(a, b, s, interpret=interpret))
  record("check_fwd", rel_err=rel_err(poisoned(fwd, xs, p["gate"], sizes), ref_fwd))
  record("check_dgrad", rel_err=rel_err(poisoned(dgrad, dys, p["gate"], sizes), ref_dgrad))
  record("check_wgrad", rel_err=rel_err(poisoned(wgr, xs, dys, sizes), ref_wgrad))
  half = xs.shape[0] // 2  # two groups of rows, each with its own sizes, under vmap
  s2 = jnp.stack([jnp.bincount(flat[order][:half], length=sizes.shape[0]),
                  jnp.bincount(flat[order][half:], length=sizes.shape[0])]).astype(jnp.int32)
  x2 = xs[: 2 * half].reshape(2, half, -1)
  vm = jax.jit(jax.vmap(lambda a, s: gmp.rows_matmul(a, p["gate"], s, interpret=interpret)))
  with hi:
    ref_vm = jax.vmap(lambda a, s: padded(f32(a), f32(p["gate"]), s))(x2, s2)
  record("check_fwd_vmap", rel_err=rel_err(poisoned(vm, x2, s2), ref_vm))
  return xs, sizes, dys


def sweep(xs, sizes, dys, w, fwd_blocks, wgrad_blocks, reps, interpret):
  n, d = xs.shape
  f = w.shape[2]
  flop = 2 * n * d * f
  for b in fwd_blocks:
    for name, fn, args in (
        ("fwd", lambda a, w, s, b=b: gmp.rows_matmul(a, w, s, blocks=b, interpret=interpret),
         (xs, w, sizes)),
        ("dgrad", lambda a, w, s, b=b: gmp.rows_matmul(a, w, s, transpose_w=True, blocks=b,
                                                       interpret=interpret),
         (dys, w, sizes))):
      try:
        t, ts = median_time(jax.jit(fn), [args], reps, calls=5)
        record(f"kernel_{name}_{tag(b)}", ms=t * 1e3, tflops=flop / t / 1e12, times=ts)
      except Exception as err:  # pylint: disable=broad-except
        record(f"kernel_{name}_{tag(b)}", error=str(err).splitlines()[0][:200])
  for b in wgrad_blocks:
    fn = jax.jit(lambda a, g, s, b=b: gmp.wgrad(a, g, s, blocks=b, interpret=interpret))
    try:
      t, ts = median_time(fn, [(xs, dys, sizes)], reps, calls=5)
      record(f"kernel_wgrad_{tag(b)}", ms=t * 1e3, tflops=flop / t / 1e12, times=ts)
    except Exception as err:  # pylint: disable=broad-except
      record(f"kernel_wgrad_{tag(b)}", error=str(err).splitlines()[0][:200])
  dense = jax.jit(lambda a, b: a @ b)
  t, ts = median_time(dense, [(xs, w[0])], reps, calls=5)
  record("dense_same_rows", ms=t * 1e3, tflops=flop / t / 1e12, times=ts)


def moe_layer(p, reps, interpret, fwd_blocks, wgrad_blocks):
  t, k = p["ids"].shape
  routed_flops = 3 * 2 * t * k * 3 * p["x"].shape[1] * F_TRUE
  counts = np.asarray(jnp.bincount(p["ids"].reshape(-1), length=p["gate"].shape[0]))
  pallas = lambda a, w, s: gmp.grouped_matmul(  # noqa: E731
      a, w, s, fwd_blocks=fwd_blocks, wgrad_blocks=wgrad_blocks, interpret=interpret)
  impls = {"tiled": grouped_gemm.padded_grouped_matmul, "pallas": pallas}
  grads = {}
  for name, gm in impls.items():
    def loss(x, gate, up, down, gm=gm):
      y = moe.experts_dispatch(x, p["weights"], p["ids"], gate, up, down, grouped_matmul=gm)
      return jnp.sum(y.astype(jnp.float32) * p["dy"])
    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    args = (p["x"], p["gate"], p["up"], p["down"])
    tm, ts = median_time(fn, [args], reps, calls=5)
    grads[name] = fn(*args)
    record(f"moe_fwd_bwd_{name}", ms=tm * 1e3, routed_tflops=routed_flops / tm / 1e12,
           imbalance_max_over_mean=float(counts.max() / counts.mean()), times=ts)
  for i, name in enumerate(("x", "gate", "up", "down")):
    record(f"moe_grad_{name}_pallas_vs_tiled",
           rel_err=rel_err(grads["pallas"][i], grads["tiled"][i]))
  if "matmul_bf16_8192" in RESULTS:
    record("moe_pallas_fraction_of_matmul",
           fraction=RESULTS["moe_fwd_bwd_pallas"]["routed_tflops"]
           / RESULTS["matmul_bf16_8192"]["tflops"])


def ceiling(reps, n=8192):
  """The bf16 dense matmul rate, timed like the kernels (3 input pairs in rotation)."""
  keys = jax.random.split(jax.random.key(0), 3)
  pairs = [(jax.random.normal(k, (n, n), jnp.bfloat16),
            jax.random.normal(jax.random.fold_in(k, 1), (n, n), jnp.bfloat16)) for k in keys]
  t, times = median_time(jax.jit(lambda a, b: a @ b), pairs, reps, calls=6, warmup=3)
  record("matmul_bf16_8192", ms=t * 1e3, tflops=2 * n**3 / t / 1e12, times=times)


def main():
  gpu = jax.default_backend() == "gpu"
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tokens", type=int, default=16384 if gpu else 64)
  parser.add_argument("--reps", type=int, default=20 if gpu else 2)
  parser.add_argument("--fwd-sweep", default=_FWD_SWEEP if gpu else "16x16x16w4s3")
  parser.add_argument("--wgrad-sweep", default=_WGRAD_SWEEP if gpu else "16x16x16w4s3")
  # The interpreter runs every program in turn: on CPU only the checks, at a small size.
  parser.add_argument("--parts", default="ceiling,checks,sweep,moe" if gpu else "checks")
  args = parser.parse_args()
  interpret = not gpu
  parts = args.parts.split(",")
  p = moe_problem(args.tokens)
  fwd_blocks, wgrad_blocks = parse_blocks(args.fwd_sweep), parse_blocks(args.wgrad_sweep)
  print(f"device: {jax.devices()[0].device_kind}, tokens {args.tokens}", flush=True)
  if "ceiling" in parts:
    ceiling(args.reps)
  if "checks" in parts or "sweep" in parts:
    xs, sizes, dys = checks(p, interpret)
  if "sweep" in parts:
    sweep(xs, sizes, dys, p["gate"], fwd_blocks, wgrad_blocks, args.reps, interpret)
  if "moe" in parts:
    def best(kind, blocks, default):  # the sweep's fastest, else the module's default
      timed = [b for b in blocks if "ms" in RESULTS.get(f"kernel_{kind}_{tag(b)}", {})]
      return min(timed, key=lambda b: RESULTS[f"kernel_{kind}_{tag(b)}"]["ms"], default=default)
    fwd, wgr = best("fwd", fwd_blocks, gmp.FORWARD), best("wgrad", wgrad_blocks, gmp.WGRAD)
    record("moe_blocks", fwd=tag(fwd), wgrad=tag(wgr))
    moe_layer(p, args.reps, interpret, fwd, wgr)
  if os.environ.get("OUT"):
    path = pathlib.Path(os.environ["OUT"]) / "grouped_gemm_bench.json"
    path.write_text(json.dumps({"device": jax.devices()[0].device_kind, "tokens": args.tokens,
                                "results": RESULTS}, indent=1))


if __name__ == "__main__":
  main()
