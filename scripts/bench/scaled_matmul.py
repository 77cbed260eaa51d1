"""Simulated blockwise FP8 GEMM (FP32 accumulation): check and time its implementations.

    python scripts/bench/scaled_matmul.py                      # A [8192, 2048], Bt [1280, 2048]
    python scripts/bench/scaled_matmul.py --configs 128x128x128x8x3,64x128x64x4x4b

A: E4M3 1x128 tiles, Bt: E4M3 128x128 blocks (the input and weight roles of
``fp8jax.gemm.dense``). Checks the Pallas kernel against the XLA interval loop and both against
the old formula (``[M, N, J]`` partial products, float32 HIGHEST einsum): max |diff| /
max |y|. Times (median over ``--runs`` of 10 back-to-back calls after warm-up, synchronised
with ``block_until_ready``) the old formula, the XLA loop, the Pallas kernel per
configuration (``parse_config``; with FP8 dots too) and a plain bf16 ``a @ b.T`` with
float32 output; with ``--chained``, the kernel with one promotion for the whole of K (a
bound on its cost). With ``$OUT`` set, writes ``$OUT/scaled_matmul_bench.json``. Without a
GPU: small shapes, the Pallas interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _repo  # noqa: E402,F401
from _timing import median_time  # noqa: E402
import jax  # noqa: E402
from jax import lax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import fp8jax  # noqa: E402
from fp8jax.gemm import accumulate  # noqa: E402
from fp8jax.kernels import scaled_matmul_pallas as kernel  # noqa: E402
from fp8jax.numerics import roles as roles_lib  # noqa: E402
from fp8jax.quant import qtensor  # noqa: E402


def old_einsum(qa, qb):
  """The formula before the interval loop: float32 [B, M, N, J] partial products."""
  k = qa.shape[-1]
  interval = 128
  j = k // interval
  sa = accumulate._interval_scales(qa, interval, j)
  sb = accumulate._interval_scales(qb, interval, j)
  a, b = lax.optimization_barrier((qtensor.payload_f32(qa.data), qtensor.payload_f32(qb.data)))
  nb, m, _ = a.shape
  n = b.shape[1]
  parts = jnp.einsum("bmjc,bnjc->bmnj", a.reshape(nb, m, j, interval),
                     b.reshape(nb, n, j, interval), precision=lax.Precision.HIGHEST,
                     preferred_element_type=jnp.float32)
  return jnp.sum(parts * (sa[:, :, None, :] * sb[:, None, :, :]), axis=-1)


def parse_config(cfg):
  """``BMxBNxBKxWARPSxSTAGES`` and letters: b bfloat16 payloads converted before the
  kernel (as ``accumulate.scaled_matmul`` does; else FP8 converted in it), o / f the
  "overlap" / "flat" schedule, m output tiles along M launched together, q FP8 dots (the
  payloads as they are on the FP8 tensor cores, ``fp8_dots``; ``GemmConfig.fp8_mma``)."""
  digits = cfg.rstrip("bmofq")
  bm, bn, bk, warps, stages = (int(v) for v in digits.split("x"))
  flags = cfg[len(digits):]
  schedule = "overlap" if "o" in flags else "flat" if "f" in flags else "interval"
  return dict(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages,
              schedule=schedule, n_fastest=False if "m" in flags else None,
              fp8_dots="q" in flags), "b" in flags


def pallas_fn(cfg, interpret, interval=128):
  """The kernel for configuration ``cfg``; ``interval`` > 128 chains the dots between
  promotions (not the simulated product: a bound on its cost)."""
  kwargs, bf16 = parse_config(cfg)

  def f(qa, qb):
    k = qa.shape[-1]
    sa = accumulate._interval_scales(qa, 128, k // 128)[..., :k // interval]
    sb = accumulate._interval_scales(qb, 128, k // 128)[..., :k // interval]
    return kernel.scaled_matmul_pallas(qa.data, qb.data, sa, sb, interval=interval,
                                       convert_in_kernel=not bf16, interpret=interpret,
                                       **kwargs)
  return jax.jit(f)


def main():
  gpu = jax.default_backend() == "gpu"
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--m", type=int, default=8192 if gpu else 256)
  p.add_argument("--n", type=int, default=1280 if gpu else 160)
  p.add_argument("--k", type=int, default=2048 if gpu else 512)
  p.add_argument("--runs", type=int, default=20 if gpu else 3)
  p.add_argument("--configs", default="128x128x128x8x3b,128x128x128x8x3,64x128x128x4x4b,"
                 "128x64x128x4x4b,128x256x128x8x2b,128x128x128x8x3bo,128x128x64x8x4bf,"
                 "128x128x128x8x3q,128x128x128x4x4q,64x128x128x4x4q,128x256x128x8x3q"
                 if gpu else "64x64x64x4x3b,32x32x64x4x3",
                 help="Pallas configurations, comma-separated (see parse_config)")
  p.add_argument("--chained", default="128x256x64x8x3b" if gpu else "",
                 help="configurations timed with one promotion for the whole of K")
  args = p.parse_args()
  dev = jax.devices()[0]
  print(f"jax {jax.__version__}, {jax.default_backend()} {dev.device_kind}; A [{args.m}, "
        f"{args.k}], Bt [{args.n}, {args.k}]", flush=True)
  roles = roles_lib.deepseek_v3_roles()
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (1, args.m, args.k), jnp.bfloat16)
  b = jax.random.normal(kb, (1, args.n, args.k), jnp.bfloat16) * 0.02
  qa, qb = jax.jit(lambda x, w: (qtensor.quantize(x, roles.input),
                                 qtensor.quantize(w, roles.weight)))(a, b)
  a_bf, b_bf = (fp8jax.dequantize(q, jnp.bfloat16) for q in (qa, qb))

  fns = {"old einsum [M,N,J]": (jax.jit(old_einsum), (qa, qb)),
         "xla interval loop": (jax.jit(lambda x, y: accumulate.scaled_matmul(x, y, impl="xla")),
                               (qa, qb))}
  for cfg in (c for c in args.configs.split(",") if c):
    fns[f"pallas {cfg}"] = (pallas_fn(cfg, not gpu), (qa, qb))
  for cfg in (c for c in args.chained.split(",") if c):
    fns[f"chained {cfg}"] = (pallas_fn(cfg, not gpu, args.k), (qa, qb))
  fns["bf16 a @ b.T"] = (jax.jit(lambda x, y: jnp.einsum(
      "bmk,bnk->bmn", x, y, preferred_element_type=jnp.float32)), (a_bf, b_bf))

  res = {"device": dev.device_kind, "jax": jax.__version__,
         "auto impl": accumulate.fp32_impl(128, (qa.data.dtype, qb.data.dtype), "auto"),
         "shape": {"m": args.m, "n": args.n, "k": args.k}, "results": {}}
  ref = fns["xla interval loop"][0](qa, qb)
  scale = float(jnp.max(jnp.abs(ref)))
  hlo = fns["xla interval loop"][0].lower(qa, qb).compile().as_text()
  res["xla loop has fp8 GEMM"] = "matmul$f8" in hlo  # XLA:GPU cuBLASLt FP8 custom call
  for name, (f, fargs) in fns.items():
    r = res["results"][name] = {}
    try:
      y = f(*fargs)
      r["max_rel_diff_vs_xla_loop"] = float(jnp.max(jnp.abs(y - ref))) / scale
      mem = f.lower(*fargs).compile().memory_analysis()
      r["temp_mib"] = None if mem is None else mem.temp_size_in_bytes / 2**20
      r["ms"] = 1e3 * median_time(f, [fargs], args.runs, calls=10, warmup=3)[0]
    except Exception as e:  # noqa: BLE001 - a configuration that fails to compile
      r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    print(name, r, flush=True)
  bf16_ms = res["results"]["bf16 a @ b.T"].get("ms")
  print(f"\n{'implementation':26} {'ms':>9} {'x bf16':>7} {'temp MiB':>9} {'rel diff':>9}")
  for name, r in res["results"].items():
    if "error" in r:
      print(f"{name:26} {r['error'][:100]}")
      continue
    ratio = r["ms"] / bf16_ms if bf16_ms else float("nan")
    temp = r["temp_mib"] if r["temp_mib"] is not None else float("nan")
    print(f"{name:26} {r['ms']:9.4f} {ratio:7.2f} {temp:9.1f} "
          f"{r['max_rel_diff_vs_xla_loop']:9.2e}")
  print(f"XLA loop uses a real FP8 GEMM: {res['xla loop has fp8 GEMM']}; scaled_matmul "
        f"impl='auto' takes {res['auto impl']!r}")
  if os.environ.get("OUT"):
    out = pathlib.Path(os.environ["OUT"], "scaled_matmul_bench.json")
    out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
  main()
