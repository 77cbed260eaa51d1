"""Grouped blockwise-scaled FP8 GEMM (``gemm:fp32_blockwise``) at the 2B MoE shapes.

    python scripts/bench/grouped_scaled.py     # GPU: checks, timings, memory (est. ~2 min)
    python scripts/bench/grouped_scaled.py     # CPU: smoke test, small shapes, interpreter

Problem (``_moe_problem``): T tokens (16384) routed top-7 = 114688 rows sorted by expert,
d 1280, f 896, 63 experts, Zipf-skewed group sizes; the gate GEMM's three directions with
the DeepSeek-V3 roles (E4M3; X and dY in 1x128 tiles, W in 128x128 blocks), through
``fp8jax.kernels.grouped_scaled_pallas``:

* fprop: X [N, d] (tiles along d) x W^T [E, f, d] (``transpose_b``) -> [N, f];
* dgrad: dY [N, f] (tiles along f) x W [E, d, f] (``transpose_b``) -> [N, d];
* wgrad: X^T [d, N_pad] x dY^T [f, N_pad], each group zero-padded to a multiple of 128
  rows and quantized in 1x128 tiles along the rows (``groups_aligned``) -> [E, d, f];
  ``wgrad_unpadded``: the same on the unpadded rows (tiles shared by two experts).

1. Checks (default blocks): each kernel against the XLA reference
   (``tests/references/grouped_scaled_reference.py``) as ||out - ref|| / ||ref|| (float32
   rounding: expect < 1e-5) and max |out - ref| / max |ref|, the output computed right after
   freeing a NaN-filled buffer of its size (NaNs: elements never written); and against the BF16
   grouped GEMM of the unquantized operands (the FP8 quantization error, ~3e-2).
2. Timings: median ms per call (``_timing.median_time``: ``--reps`` runs of 5 calls) of
   the kernel on quantized operands per block configuration (``--rows-blocks``,
   ``--wgrad-blocks``: ``MxNxKwWARPSsSTAGES``, ``c`` = 8-bit payloads converted in the
   kernel), the kernel with the quantization of its operands (default blocks; wgrad with
   the padding), and the BF16 grouped GEMM per direction (``grouped_gpu``'s kernel choice);
   ratios FP8 / BF16 per direction and for the three together.
3. Memory: each timed function's compiled temp and output bytes; the device's peak bytes
   in use at the end.

With ``$OUT`` set, writes ``$OUT/grouped_scaled_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _moe_problem import D, E, F, K, moe_problem  # noqa: E402
import _repo  # noqa: E402,F401
from _results import RESULTS, record  # noqa: E402
from _timing import count_nans, median_time, poisoned  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from fp8jax.kernels import grouped_gpu  # noqa: E402
from fp8jax.kernels import grouped_scaled_pallas as gsp  # noqa: E402
from fp8jax.numerics import roles as roles_lib  # noqa: E402
from fp8jax.quant import qtensor  # noqa: E402
from tests.references import grouped_scaled_reference as ref  # noqa: E402

ROLES = roles_lib.deepseek_v3_roles()
INTERVAL = 128
_ROWS_SWEEP = "128x128x128w8s3,128x128x128w8s3c,128x128x64w8s4,128x256x64w8s3,64x128x128w4s4"
_WGRAD_SWEEP = "128x128x128w8s3,128x128x128w8s3c,128x128x64w8s4,128x256x64w8s3,256x128x64w8s3"


def parse_blocks(text: str) -> list[tuple[str, gsp.Blocks, bool]]:
  """``"128x128x128w8s3c,..."`` -> (tag, Blocks, convert_in_kernel) per entry."""
  out = []
  for item in filter(None, text.split(",")):
    body = item.rstrip("c")
    mnk, rest = body.split("w")
    warps, stages = rest.split("s")
    m, n, k = map(int, mnk.split("x"))
    out.append((item, gsp.Blocks(m, n, k, int(warps), int(stages)), item.endswith("c")))
  return out


def pad_groups(x, sizes, multiple: int):
  """Rows sorted by group, each group zero-padded to a multiple of ``multiple`` rows:
  ``(x_pad [N + E * (multiple - 1) rounded up, C], padded sizes [E])``."""
  n, e = x.shape[0], sizes.shape[0]
  n_pad = -(-(n + e * (multiple - 1)) // multiple) * multiple
  padded = (sizes + multiple - 1) // multiple * multiple
  group = jnp.repeat(jnp.arange(e), sizes, total_repeat_length=n)
  dest = (jnp.cumsum(padded) - padded)[group] + jnp.arange(n) - (jnp.cumsum(sizes) - sizes)[group]
  dest = jnp.where(jnp.arange(n) < jnp.sum(sizes), dest, n_pad)
  return jnp.zeros((n_pad, x.shape[1]), x.dtype).at[dest].set(x, mode="drop"), padded


def _wq(w):  # one expert's weight [R, C] quantized on its own, 128x128 blocks, vmapped
  return jax.vmap(lambda m: qtensor.quantize(m, ROLES.weight))(w)


def quant_fprop(x, w):
  return qtensor.quantize(x, ROLES.input), _wq(jnp.swapaxes(w, 1, 2))  # [N, d], [E, f, d]


def quant_dgrad(dy, w):
  return qtensor.quantize(dy, ROLES.grad), _wq(w)  # [N, f], [E, d, f]


def quant_wgrad(x, dy, sizes, pad=True):
  if pad:
    x, padded = pad_groups(x, sizes, INTERVAL)
    dy, _ = pad_groups(dy, sizes, INTERVAL)
  else:
    padded = sizes
  return (qtensor.quantize(x.T, ROLES.input), qtensor.quantize(dy.T, ROLES.grad),
          padded)  # [d, N_pad], [f, N_pad]


def make_fns(impls, interpret, blocks, wblocks, cik=False):
  """{name: fn} of the kernels on quantized operands, with quantization, and BF16."""
  def rows(aq, bq, s):
    return gsp.grouped_scaled_matmul(aq.data, aq.scale_inv, bq.data, bq.scale_inv, s,
                                     transpose_b=True, interval=INTERVAL, blocks=blocks,
                                     convert_in_kernel=cik, interpret=interpret)

  def wgrad(xtq, dytq, s, aligned=True):
    return gsp.grouped_scaled_wgrad(xtq.data, xtq.scale_inv, dytq.data, dytq.scale_inv, s,
                                    interval=INTERVAL, groups_aligned=aligned, blocks=wblocks,
                                    convert_in_kernel=cik, interpret=interpret)

  return {
      "fprop": rows, "dgrad": rows, "wgrad": wgrad,
      "wgrad_unpadded": lambda a, b, s: wgrad(a, b, s, aligned=False),
      "fprop_quant": lambda x, w, s: rows(*quant_fprop(x, w), s),
      "dgrad_quant": lambda dy, w, s: rows(*quant_dgrad(dy, w), s),
      "wgrad_quant": lambda x, dy, s: wgrad(*quant_wgrad(x, dy, s)),
      "fprop_bf16": lambda x, w, s: grouped_gpu._rows(impls["fwd"], x, w, s, False, True),
      "dgrad_bf16": lambda dy, w, s: grouped_gpu._rows(impls["dgrad"], dy, w, s, True, True),
      "wgrad_bf16": lambda x, dy, s: grouped_gpu._wgrad(impls["wgrad"], x, dy, s),
  }


def _memory(compiled) -> dict:
  mem = compiled.memory_analysis()
  if mem is None:
    return {}
  return {"temp_mib": mem.temp_size_in_bytes / 2**20, "out_mib": mem.output_size_in_bytes / 2**20}


def _err(name, err):
  traceback.print_exc()
  record(name, error=f"{type(err).__name__}: {str(err).splitlines()[0][:300]}")


def checks(fns, ops, bf16_out):
  """Kernel vs XLA reference (and vs the BF16 GEMM) with poisoned outputs."""
  refs = {
      "fprop": lambda aq, bq, s: ref.rows_reference(aq.data, aq.scale_inv, bq.data,
                                                    bq.scale_inv, s, transpose_b=True),
      "wgrad": lambda xq, dq, s: ref.wgrad_reference(xq.data, xq.scale_inv, dq.data,
                                                     dq.scale_inv, s),
  }
  refs["dgrad"], refs["wgrad_unpadded"] = refs["fprop"], refs["wgrad"]
  norm = jax.jit(lambda out, want: (jnp.linalg.norm(out - want) / jnp.linalg.norm(want),
                                    jnp.max(jnp.abs(out - want)) / jnp.max(jnp.abs(want))))
  for name in ("fprop", "dgrad", "wgrad", "wgrad_unpadded"):
    try:
      out = poisoned(jax.jit(fns[name]), *ops[name])
      want = jax.jit(refs[name])(*ops[name])
      rel, max_rel = (float(v) for v in norm(out, want))
      base = bf16_out[name.split("_")[0]].astype(jnp.float32)
      rel_bf16 = float(norm(out, base)[0])
      record(f"check_{name}", rel_err=rel, max_rel_err=max_rel, nans=count_nans(out),
             rel_err_vs_bf16_gemm=rel_bf16, ok=bool(rel < 1e-5 and count_nans(out) == 0))
      del out, want
    except Exception as err:  # noqa: BLE001 - report and go on
      _err(f"check_{name}", err)


def timings(impls, interpret, ops, raw, rows_sweep, wgrad_sweep, reps, n_rows, d, f,
            defaults):
  flop = 2 * n_rows * d * f
  for tag, blocks, cik in rows_sweep:
    fns = make_fns(impls, interpret, blocks=blocks, wblocks=defaults[1], cik=cik)
    for name in ("fprop", "dgrad"):
      _time(f"{name}_fp8_{tag}", jax.jit(fns[name]), ops[name], reps, flop)
  for tag, blocks, cik in wgrad_sweep:
    fns = make_fns(impls, interpret, blocks=defaults[0], wblocks=blocks, cik=cik)
    _time(f"wgrad_fp8_{tag}", jax.jit(fns["wgrad"]), ops["wgrad"], reps, flop)
  fns = make_fns(impls, interpret, *defaults)
  _time("wgrad_unpadded_fp8_default", jax.jit(fns["wgrad_unpadded"]), ops["wgrad_unpadded"],
        reps, flop)
  for name in ("fprop", "dgrad", "wgrad"):
    _time(f"{name}_fp8_quant_default", jax.jit(fns[f"{name}_quant"]), raw[name], reps, flop)
    _time(f"{name}_bf16", jax.jit(fns[f"{name}_bf16"]), raw[name], reps, flop)


def _time(name, fn, args, reps, flop):
  try:
    compiled = fn.lower(*args).compile()  # one compilation for the timing and the memory
    t, ts = median_time(compiled, [args], reps, calls=5)
    record(name, ms=t * 1e3, tflops=flop / t / 1e12, **_memory(compiled), times=ts)
  except Exception as err:  # noqa: BLE001 - a configuration that fails to compile
    _err(name, err)


def summary():
  """FP8 / BF16 per direction: the fastest kernel configuration, and with quantization."""
  def ms(key):
    return RESULTS.get(key, {}).get("ms")

  tot = {"bf16": 0.0, "best": 0.0, "quant": 0.0}
  for name in ("fprop", "dgrad", "wgrad"):
    timed = {k: v["ms"] for k, v in RESULTS.items()
             if k.startswith(f"{name}_fp8_") and "quant" not in k and "unpadded" not in k
             and "ms" in v}
    bf16 = ms(f"{name}_bf16")
    if not timed or bf16 is None:
      continue
    best = min(timed, key=timed.get)
    quant = ms(f"{name}_fp8_quant_default")
    record(f"ratio_{name}", best=best, fp8_over_bf16=timed[best] / bf16,
           quant_default_over_bf16=None if quant is None else quant / bf16)
    tot["bf16"] += bf16
    tot["best"] += timed[best]
    tot["quant"] += quant or float("nan")
  if tot["bf16"]:
    record("ratio_three_directions", fp8_over_bf16=tot["best"] / tot["bf16"],
           quant_default_over_bf16=tot["quant"] / tot["bf16"])


def main():
  gpu = jax.default_backend() == "gpu"
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--tokens", type=int, default=16384 if gpu else 32)
  p.add_argument("--d", type=int, default=D if gpu else 256)
  p.add_argument("--f", type=int, default=F if gpu else 256)
  p.add_argument("--experts", type=int, default=E if gpu else 8)
  p.add_argument("--top-k", type=int, default=K)
  p.add_argument("--reps", type=int, default=20 if gpu else 1)
  p.add_argument("--rows-blocks", default=_ROWS_SWEEP if gpu else "32x32x32w4s3")
  p.add_argument("--wgrad-blocks", default=_WGRAD_SWEEP if gpu else "32x32x32w4s3")
  p.add_argument("--parts", default="checks,timings")
  args = p.parse_args()
  interpret = not gpu
  # The interpreter runs every program in turn: small blocks for the checks too.
  defaults = (gsp.ROWS, gsp.WGRAD) if gpu else (gsp.Blocks(m=32, n=32, k=32),) * 2
  parts = args.parts.split(",")
  prob = moe_problem(args.tokens, d=args.d, f=args.f, e=args.experts, k=args.top_k)
  ids = prob["ids"].reshape(-1)
  order = jnp.argsort(ids, stable=True)
  xs = jnp.take(prob["x"], order // args.top_k, axis=0)  # [N, d] bf16
  sizes = jnp.bincount(ids, length=args.experts).astype(jnp.int32)
  w = prob["gate"]  # [E, d, f]
  dys = jax.random.normal(jax.random.key(9), (xs.shape[0], args.f), jnp.bfloat16)
  n = xs.shape[0]
  dev = jax.devices()[0]
  print(f"jax {jax.__version__}, {dev.device_kind}: N {n}, d {args.d}, f {args.f}, E "
        f"{args.experts}, largest group {int(jnp.max(sizes))}", flush=True)
  impls = grouped_gpu.choose(xs.shape, w.shape, xs.dtype)
  record("problem", rows=n, d=args.d, f=args.f, experts=args.experts,
         max_over_mean=float(jnp.max(sizes) / jnp.mean(sizes)), bf16_impls=str(impls))
  raw = {"fprop": (xs, w, sizes), "dgrad": (dys, w, sizes), "wgrad": (xs, dys, sizes)}
  ops = {"fprop": (*jax.jit(quant_fprop)(xs, w), sizes),
         "dgrad": (*jax.jit(quant_dgrad)(dys, w), sizes),
         "wgrad": jax.jit(quant_wgrad)(xs, dys, sizes),
         "wgrad_unpadded": jax.jit(lambda a, b, s: quant_wgrad(a, b, s, pad=False))(
             xs, dys, sizes)}
  fns = make_fns(impls, interpret, *defaults)
  if "checks" in parts:
    bf16_out = {k: jax.jit(fns[f"{k}_bf16"])(*raw[k]) for k in ("fprop", "dgrad", "wgrad")}
    checks(fns, ops, bf16_out)
    del bf16_out
  if "timings" in parts:
    timings(impls, interpret, ops, raw, parse_blocks(args.rows_blocks),
            parse_blocks(args.wgrad_blocks), args.reps, n, args.d, args.f, defaults)
    summary()
  stats = dev.memory_stats() or {}
  record("device_memory", peak_gib=stats.get("peak_bytes_in_use", 0) / 2**30,
         in_use_gib=stats.get("bytes_in_use", 0) / 2**30,
         limit_gib=stats.get("bytes_limit", 0) / 2**30)
  if os.environ.get("OUT"):
    path = pathlib.Path(os.environ["OUT"]) / "grouped_scaled_bench.json"
    path.write_text(json.dumps({"device": dev.device_kind, "jax": jax.__version__,
                                "results": RESULTS}, indent=1, default=str))


if __name__ == "__main__":
  main()
