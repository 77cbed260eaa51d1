"""Profile of the 2B BF16 train step (and one paired evaluation): device time by category.

    python scripts/bench/profile_step.py --batch=8 --moe-impl=pallas   # $OUT: JSON + trace
    python scripts/bench/profile_step.py --parts=paired --paired-policy=gemm:fp32_blockwise

Traces ``--steps`` train steps after a warm-up with ``jax.profiler.trace`` (perfetto
trace), then sums the GPU kernels' durations by category from their names:

  grouped GEMM  the MoE experts' kernels (Mosaic ragged dot, Triton grouped GEMM)
  dense GEMM    cuBLAS / CUTLASS / XLA GEMM kernels (attention projections, shared
                experts, router, head)
  attention     cuDNN flash attention (or XLA's softmax fusions when it is off: "other")
  dispatch      sort, gather and scatter kernels of the MoE dispatch
  optimizer     measured apart: the optimizer update alone (AdamW + clip, jitted by itself);
                inside the step its fusions are counted in "other"
  other         every other fusion (norms, activations, casts, RoPE, loss, ...)

Prints the table and the 40 longest kernels. With ``$OUT`` set, writes
``$OUT/profile_step.json`` and the perfetto trace.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _repo  # noqa: E402,F401
from _results import RESULTS, record  # noqa: E402
from _timing import median_time  # noqa: E402
import _variants  # noqa: E402
import fusion_bytes  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from fp8jax.models import config as mc  # noqa: E402
from fp8jax.models import deepseek_model  # noqa: E402
from fp8jax.models import deepseek_moe as dm  # noqa: E402
from fp8jax.models import policy as pl  # noqa: E402
from fp8jax.study.comparison import paired  # noqa: E402
from fp8jax.train import flops, optim  # noqa: E402
from fp8jax.train import mesh as mesh_lib  # noqa: E402
from fp8jax.train import step as step_lib  # noqa: E402

CATEGORIES = (  # first match wins; names are lower-cased
    ("grouped GEMM", r"ragged|fp8jax_grouped|mosaic|mgpu"),
    ("attention", r"cudnn|fmha|flash|sdpa|dot_product_attention"),
    ("dense GEMM", r"gemm|cutlass|xmma|nvjet|cublas|matmul|wgmma"),
    ("dispatch", r"sort|gather|scatter|radix|cub::|onesweep"),
  ("fake quant", r"fp8jax_fake_quant"),
)


def category(name: str) -> str:
  low = name.lower()
  for cat, pattern in CATEGORIES:
    if re.search(pattern, low):
      return cat
  return "other"


def profile(fn, args, steps: int, label: str, keep: pathlib.Path | None):
  jax.block_until_ready(fn(*args))
  tmp = pathlib.Path(tempfile.mkdtemp())
  with jax.profiler.trace(str(tmp), create_perfetto_trace=True):
    for _ in range(steps):
      out = fn(*args)
    jax.block_until_ready(out)
  trace = next(tmp.rglob("perfetto_trace.json.gz"))
  kt = fusion_bytes.kernel_ms(trace)  # {kernel: ms over the steps}
  if keep:
    shutil.copy(trace, keep / f"trace_{label}.json.gz")
  by = collections.Counter()
  for name, ms in kt.items():
    by[category(name)] += ms
  total = sum(by.values())
  record(f"{label}/breakdown", **{k: round(v / steps, 3) for k, v in by.items()},
         device_ms_per_step=total / steps)
  record(f"{label}/top_kernels", **{n[:90]: round(ms / steps, 3)
                                     for n, ms in kt.most_common(40)})
  return total / steps, by


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=2048)
  ap.add_argument("--steps", type=int, default=3)
  ap.add_argument("--moe-impl", default="pallas", choices=["dispatch", "pallas"])
  ap.add_argument("--attention", default="auto", choices=["auto", "xla", "cudnn"])
  ap.add_argument("--parts", default="train,paired")
  ap.add_argument("--scan-layers", action="store_true", help="the layers as lax.scans")
  ap.add_argument("--fuse-gate-up", action="store_true",
                  help="the routed experts' gate and up as one grouped GEMM (BF16 layers)")
  ap.add_argument("--paired-policy", default="moe_l0-8_e4m3",
                  help="the variant of the paired evaluation (a policy expression)")
  args = ap.parse_args()
  if args.fuse_gate_up:
    _variants.fuse_gate_up()
  keep = pathlib.Path(os.environ["OUT"]) if os.environ.get("OUT") else None
  cfg = mc.deepseek_moe_2b(expert_pad_to=896, attention_impl=args.attention)
  params = jax.jit(dm.init, static_argnums=0)(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (args.batch, args.seq), 0, cfg.vocab_size)
  mesh = mesh_lib.data_mesh()
  tag = (f"{args.attention}_{args.moe_impl}_b{args.batch}" + "_scan" * args.scan_layers
         + "_fused" * args.fuse_gate_up)
  n = 8192
  ab = [(jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16),) * 2 for i in range(3)]
  t_mm, _ = median_time(jax.jit(lambda a, b: a @ b), ab, runs=10, calls=6, warmup=3)
  ceiling = 2 * n**3 / t_mm
  record("matmul_bf16_8192", tflops=ceiling / 1e12)
  del ab
  if "train" in args.parts:
    tx = optim.optimizer(optim.OptimConfig())
    state = step_lib.init_state(params, tx)
    opt = jax.jit(lambda st, g: optax.apply_updates(st.params, tx.update(g, st.opt_state,
                                                                         st.params)[0]))
    zeros = jax.tree.map(jnp.zeros_like, params)
    t_opt, _ = median_time(opt, [(state, zeros)], runs=5)
    del zeros
    model = deepseek_model.model(cfg, deepseek_model.Options(
        args.moe_impl, scan=args.scan_layers or None))
    step = jax.jit(step_lib.make_train_step(model, tx), donate_argnums=0)
    holder = {"state": state}  # params are donated from here on

    def run(x):
      holder["state"], m = step(holder["state"], x)
      return m["loss"]

    t0 = time.perf_counter()
    jax.block_until_ready(run(tokens))
    print(f"[train step compiled and run once in {time.perf_counter() - t0:.0f} s]", flush=True)
    t_step, _ = median_time(run, [(tokens,)], runs=5)
    tps = args.batch * args.seq / t_step
    peak = flops.peak_flops(jax.devices()[0].device_kind)
    record(f"train_{tag}", step_ms=t_step * 1e3, optimizer_only_ms=t_opt * 1e3,
           tokens_per_s=tps, flops_per_token=flops.flops_per_token(model, args.seq),
           mfu_vs_datasheet=flops.mfu(tps, model, args.seq, peak, 1) or float("nan"),
           mfu_vs_measured_matmul=flops.mfu(tps, model, args.seq, ceiling, 1))
    profile(run, (tokens,), args.steps, f"train_{tag}", keep)
    del holder, step, state
    params = jax.jit(dm.init, static_argnums=0)(cfg, jax.random.key(0))
  if "paired" in args.parts:
    pol = pl.parse_policy(args.paired_policy)
    scanned = deepseek_model.model(cfg, deepseek_model.Options(scan=args.scan_layers or None))
    ev = paired.PairedEvaluator(scanned, [pol], mesh, args.moe_impl)
    t_base, _ = median_time(ev.baseline, [(params, tokens)], runs=5)
    base = ev.baseline(params, tokens)
    t_var, _ = median_time(lambda p, x, b: ev.variant(pol.name, p, x, b)["compare"],
                           [(params, tokens, base)], runs=5)
    del base
    record(f"paired_{tag}", bf16_grad_ms=t_base * 1e3, variant_ms=t_var * 1e3,
           ratio_to_two_bf16=(t_base + t_var) / (2 * t_base))
    pair = lambda p, x: ev.variant(pol.name, p, x, ev.baseline(p, x))["compare"]  # noqa: E731
    profile(pair, (params, tokens), args.steps, f"paired_{tag}", keep)
    base = ev.baseline(params, tokens)
    variant = lambda p, x, b: ev.variant(pol.name, p, x, b)["compare"]  # noqa: E731
    profile(variant, (params, tokens, base), args.steps, f"variant_{tag}", keep)
  if keep:
    (keep / f"profile_step_{tag}.json").write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
  main()
