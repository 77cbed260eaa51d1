"""MoE grouped GEMMs side by side: JAX's Mosaic GPU kernels, the project's Triton kernels,
XLA, and cuBLAS on the same rows; plus cuDNN against XLA attention. Hopper GPUs only.

    python scripts/bench/mosaic_grouped.py                      # 2B and 16B shapes
    python scripts/bench/mosaic_grouped.py --shapes=2b --parts=checks,sweep

Shapes (``--shapes``): ``2b`` is d = 1280, f = 896 (853 zero-padded), 63 experts, top-7;
``16b`` is d = 2048, f = 1408, 64 experts, top-6; both with ``--tokens`` tokens (16384)
and Zipf-skewed routing (``_moe_problem``).

1. ``ceiling``: bf16 [8192]^3 matmul; per shape cuBLAS on the routed rows as one dense GEMM
   ([N, d] x [d, f], N = tokens x top-k).
2. ``sweep``: every Mosaic configuration (``--configs``) for Fprop, Dgrad and Wgrad, each
   first checked against a float32 reference on the same bf16 inputs after filling the
   output memory with NaN (``_timing.poisoned``): a configuration whose relative error
   exceeds ``--max-err`` or that leaves a NaN is rejected, not timed. The Triton kernels
   at their default blocks are timed beside them.
3. ``moe``: the MoE layer forward + backward (``moe.experts_dispatch``, gradients of x and
   the three expert weights) with each grouped GEMM (XLA tiled, Triton, Mosaic at the best
   configurations of the sweep, and ``grouped_gpu``: the model's ``moe_impl="pallas"``, a
   kernel per direction), gradients compared with the tiled float32-accumulated one.
4. ``attention``: causal attention forward + backward at [8, 2048, heads, 128] in bf16, the
   model's XLA einsum/softmax against ``jax.nn.dot_product_attention(implementation=
   "cudnn")``, with the largest output and gradient differences.

Times are medians over ``--reps`` runs of 5 back-to-back calls (``_timing.median_time``).
With ``$OUT`` set, writes ``$OUT/mosaic_grouped.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _moe_problem import moe_problem  # noqa: E402
import _repo  # noqa: E402,F401
from _results import RESULTS, record  # noqa: E402
from _timing import count_nans, median_time, poisoned  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fp8jax.gemm import grouped as grouped_gemm  # noqa: E402
from fp8jax.kernels import grouped_gpu  # noqa: E402
from fp8jax.kernels import grouped_matmul_mosaic as gmm  # noqa: E402
from fp8jax.kernels import grouped_matmul_triton as gmp  # noqa: E402
from fp8jax.models import moe  # noqa: E402

SHAPES = {"2b": dict(d=1280, f=896, f_true=853, e=63, k=7, heads=10),
          "16b": dict(d=2048, f=1408, f_true=1408, e=64, k=6, heads=16)}
_CONFIGS = ("128x128x64c5g4,128x128x64c5g2,128x128x64c6g2,128x128x64c4g2,128x128x64c3g4,"
            "128x128x64c6g1,128x64x64c4g2,64x128x64c4g2")


def parse_configs(text: str) -> list[gmm.Config]:
  """``"128x128x64c4g2,..."`` -> Config(block_m, block_n, block_k, steps, grid_block_n)."""
  out = []
  for item in filter(None, text.split(",")):
    mnk, rest = item.split("c")
    steps, gbn = rest.split("g")
    m, n, k = map(int, mnk.split("x"))
    out.append(gmm.Config(m, n, k, int(steps), int(gbn)))
  return out


def tag(c: gmm.Config) -> str:
  return f"{c.block_m}x{c.block_n}x{c.block_k}c{c.max_concurrent_steps}g{c.grid_block_n}"


def rel_err(out, ref) -> float:
  out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
  if not np.all(np.isfinite(out)):
    return float("nan")
  return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def rows(p):
  """Routed rows sorted by expert, group sizes and a cotangent of the Fprop output."""
  flat = p["ids"].reshape(-1)
  order = jnp.argsort(flat, stable=True)
  xs = jnp.take(p["x"], order // p["ids"].shape[1], axis=0)
  sizes = jnp.bincount(flat, length=p["gate"].shape[0]).astype(jnp.int32)
  dys = jax.random.normal(jax.random.key(9), (xs.shape[0], p["gate"].shape[2]), jnp.bfloat16)
  return xs, sizes, dys


def references(xs, w, sizes, dys):
  f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
  with jax.default_matmul_precision("highest"):
    fwd = jax.jit(grouped_gemm.padded_grouped_matmul)(f32(xs), f32(w), sizes)
    dgrad = jax.jit(grouped_gemm.padded_grouped_matmul)(f32(dys), jnp.swapaxes(f32(w), 1, 2), sizes)
    wg = jax.jit(lambda a, b: jax.vjp(lambda w_: grouped_gemm.padded_grouped_matmul(a, w_, sizes),
                                      f32(w))[1](b)[0])(f32(xs), f32(dys))
  return {"fwd": fwd, "dgrad": dgrad, "wgrad": wg}


def kernels(c: gmm.Config):
  return {"fwd": jax.jit(lambda a, w, s: gmm.rows_matmul(a, w, s, config=c)),
          "dgrad": jax.jit(lambda a, w, s: gmm.rows_matmul(a, w, s, transpose_w=True,
                                                           config=c)),
          "wgrad": jax.jit(lambda a, b, s: gmm.wgrad(a, b, s, config=c))}


def sweep(name, xs, sizes, dys, w, configs, reps, max_err, deadline):
  n, d = xs.shape
  flop = 2 * n * d * w.shape[2]
  args = {"fwd": (xs, w, sizes), "dgrad": (dys, w, sizes), "wgrad": (xs, dys, sizes)}
  ref = references(xs, w, sizes, dys)
  best = {}
  for c in configs:
    for kind, fn in kernels(c).items():
      key = f"{name}/mosaic_{kind}_{tag(c)}"
      if time.time() > deadline:
        record(key, skipped="time")
        continue
      why = gmm.problem(kind, args[kind][0].shape, args[kind][1].shape, xs.dtype, c)
      if why:
        record(key, rejected=why)
        continue
      try:
        out = poisoned(fn, *args[kind])
        err, nans = rel_err(out, ref[kind]), count_nans(out)
        del out
        if not err <= max_err or nans:
          record(key, rejected=f"rel_err {err:.3g}, NaNs {nans}")
          continue
        t, ts = median_time(fn, [args[kind]], reps, calls=5)
      except Exception as e:  # noqa: BLE001 - reported; e.g. shared memory exceeded
        record(key, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        continue
      record(key, ms=t * 1e3, tflops=flop / t / 1e12, rel_err=err, times=ts)
      if kind not in best or t < best[kind][1]:
        best[kind] = (c, t)
  triton = {"fwd": jax.jit(lambda a, w, s: gmp.rows_matmul(a, w, s)),
            "dgrad": jax.jit(lambda a, w, s: gmp.rows_matmul(a, w, s, transpose_w=True)),
            "wgrad": jax.jit(lambda a, b, s: gmp.wgrad(a, b, s))}
  for kind, fn in triton.items():
    err = rel_err(poisoned(fn, *args[kind]), ref[kind])
    t, ts = median_time(fn, [args[kind]], reps, calls=5)
    record(f"{name}/triton_{kind}", ms=t * 1e3, tflops=flop / t / 1e12, rel_err=err, times=ts)
  dense = jax.jit(lambda a, b: a @ b)
  t, ts = median_time(dense, [(xs, w[0])], reps, calls=5)
  record(f"{name}/cublas_same_rows", ms=t * 1e3, tflops=flop / t / 1e12, times=ts)
  record(f"{name}/mosaic_best", **{k: tag(c) for k, (c, _) in best.items()})
  return {k: c for k, (c, _) in best.items()}


def moe_layer(name, p, f_true, reps, best):
  t, k = p["ids"].shape
  routed_flops = 3 * 2 * t * k * 3 * p["x"].shape[1] * f_true
  cfgs = tuple(best.get(kind, default) for kind, default in
               (("fwd", gmm.FORWARD), ("dgrad", gmm.DGRAD), ("wgrad", gmm.WGRAD)))
  impls = {"tiled": grouped_gemm.padded_grouped_matmul, "triton": gmp.grouped_matmul,
           "mosaic": lambda a, w, s: gmm.grouped_matmul(a, w, s, configs=cfgs),
           "gpu": grouped_gpu.grouped_matmul}  # the model's moe_impl="pallas"
  grads = {}
  for impl, gm in impls.items():
    def loss(x, gate, up, down, gm=gm):
      y = moe.experts_dispatch(x, p["weights"], p["ids"], gate, up, down, grouped_matmul=gm)
      return jnp.sum(y.astype(jnp.float32) * p["dy"])
    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    # Under vmap too (the model dispatches per group of sequences).
    vfn = jax.jit(jax.vmap(fn))
    a = (p["x"], p["gate"], p["up"], p["down"])
    tm, ts = median_time(fn, [a], reps, calls=5)
    grads[impl] = fn(*a)
    gv = vfn(*(x[None] for x in a))
    record(f"{name}/moe_fwd_bwd_{impl}", ms=tm * 1e3, routed_tflops=routed_flops / tm / 1e12,
           vmap_max_abs_diff=max(float(jnp.max(jnp.abs(u[0].astype(jnp.float32)
                                                       - v.astype(jnp.float32))))
                                 for u, v in zip(gv, grads[impl])), times=ts)
  for impl in ("triton", "mosaic", "gpu"):
    for i, g in enumerate(("x", "gate", "up", "down")):
      record(f"{name}/moe_grad_{g}_{impl}_vs_tiled", rel_err=rel_err(grads[impl][i],
                                                                     grads["tiled"][i]))


def attention(heads, reps, b=8, s=2048, hd=128):
  keys = jax.random.split(jax.random.key(3), 4)
  q, k, v, do = (jax.random.normal(key, (b, s, heads, hd), jnp.bfloat16) for key in keys)

  def xla(q, k, v):  # the model's attention (models/deepseek_moe.py)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(
        jnp.float32(hd))
    causal = jnp.tril(jnp.ones((s, s), bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, -jnp.inf), axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)

  def cudnn(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

  flop = 4 * b * heads * s * s * hd / 2 * 3.5  # causal: half; fwd 1 + bwd 2.5 GEMM-equivalents
  outs = {}
  for name, f in (("xla", xla), ("cudnn", cudnn)):
    fb = jax.jit(lambda q, k, v, f=f: jax.vjp(f, q, k, v)[1](do) + (f(q, k, v),))
    t, ts = median_time(fb, [(q, k, v)], reps, calls=5)
    outs[name] = fb(q, k, v)
    record(f"attention_h{heads}/{name}_fwd_bwd", ms=t * 1e3, tflops=flop / t / 1e12, times=ts)
  record(f"attention_h{heads}/cudnn_vs_xla", **{
      n: float(jnp.max(jnp.abs(a.astype(jnp.float32) - c.astype(jnp.float32))))
      for n, a, c in zip(("dq", "dk", "dv", "out"), outs["cudnn"], outs["xla"])})


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tokens", type=int, default=16384)
  parser.add_argument("--reps", type=int, default=10)
  parser.add_argument("--shapes", default="2b,16b")
  parser.add_argument("--configs", default=_CONFIGS)
  parser.add_argument("--parts", default="ceiling,sweep,moe,attention")
  parser.add_argument("--max-err", type=float, default=2e-2)
  parser.add_argument("--max-seconds", type=float, default=420)
  args = parser.parse_args()
  deadline = time.time() + args.max_seconds
  parts = args.parts.split(",")
  print(f"device: {jax.devices()[0].device_kind}, Hopper: {gmm.available()}", flush=True)
  if "ceiling" in parts:
    n = 8192
    ab = [(jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16),) * 2 for i in range(3)]
    t, ts = median_time(jax.jit(lambda a, b: a @ b), ab, args.reps, calls=6, warmup=3)
    record("matmul_bf16_8192", ms=t * 1e3, tflops=2 * n**3 / t / 1e12, times=ts)
  for name in args.shapes.split(","):
    sh = SHAPES[name]
    p = moe_problem(args.tokens, d=sh["d"], f=sh["f"], e=sh["e"], k=sh["k"])
    best = {}
    if "sweep" in parts:
      xs, sizes, dys = rows(p)
      best = sweep(name, xs, sizes, dys, p["gate"], parse_configs(args.configs), args.reps,
                   args.max_err, deadline)
      del xs, dys
    if "moe" in parts:
      moe_layer(name, p, sh["f_true"], args.reps, best)
    if "attention" in parts:
      attention(sh["heads"], args.reps)
  if os.environ.get("OUT"):
    path = pathlib.Path(os.environ["OUT"]) / "mosaic_grouped.json"
    path.write_text(json.dumps({"device": jax.devices()[0].device_kind, "tokens": args.tokens,
                                "results": RESULTS}, indent=1))


if __name__ == "__main__":
  main()
