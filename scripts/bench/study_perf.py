"""GPU benchmarks of the study's hot paths (docs/performance.md has the method and results).

    python scripts/bench/study_perf.py --parts=ceilings,moe,train [--out=$OUT/perf.json]
    python scripts/bench/study_perf.py --parts=paired,memory

Parts:
  ceilings  device copy bandwidth (bf16 [16384, 7168]) and the bf16 matmul rate (8192^3)
  moe       one MoE layer forward + backward at 2B shapes (d 1280, f 853 padded to 896,
            63 experts, top-7, 16K tokens, Zipf-skewed routing: max/mean load ~2.7): the
            tiled dispatch, the Pallas grouped GEMM,
            lax.ragged_dot, and a capacity-padded batched matmul as a reference
  (--moe-impl=pallas, the default, runs the 2B model's routed experts through the Pallas
  grouped GEMM; --moe-impl=dispatch through XLA's, out of memory at batch 8 on one H100)
  train     the BF16 train step of deepseek_moe_2b (seq 2048), MFU as in fp8jax.train.flops,
            and the device's peak memory (--scan-layers: the layers as one lax.scan)
  paired    BF16 grad + FP8 grad on the same batch (site-grid sites and the DeepSeek-V3
            GEMM recipe) against two BF16 grads
  memory    the largest paired-evaluation batch per device (seq 2048) that fits
  compile_memory  XLA's temp/argument sizes of the compiled paired functions (no run)
  scaling   paired evaluation on 1 device vs all devices at the same per-device batch

Times are medians over repetitions after a warm-up (compilation excluded), synchronised
with block_until_ready, rotating among 3 input sets where inputs are small.
"""

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _moe_problem import F_TRUE, D, E, K, moe_problem  # noqa: E402
import _repo  # noqa: E402,F401
from _results import RESULTS, record  # noqa: E402
from _timing import median_time  # noqa: E402
import _variants  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fp8jax.gemm import grouped as grouped_gemm  # noqa: E402
from fp8jax.kernels import grouped_matmul_triton  # noqa: E402
from fp8jax.models import config as mc  # noqa: E402
from fp8jax.models import deepseek_model, moe  # noqa: E402
from fp8jax.models import deepseek_moe as dm  # noqa: E402
from fp8jax.models import policy as pl  # noqa: E402
from fp8jax.study.comparison import paired  # noqa: E402
from fp8jax.train import flops, optim  # noqa: E402
from fp8jax.train import mesh as mesh_lib  # noqa: E402
from fp8jax.train import step as step_lib  # noqa: E402


def ceilings():
  keys = jax.random.split(jax.random.key(0), 3)
  xs = [(jax.random.normal(k, (16384, 7168), jnp.bfloat16),) for k in keys]
  copy = jax.jit(lambda x: x.copy())
  t, ts = median_time(copy, xs, runs=20)
  record("copy_bf16_16384x7168", ms=t * 1e3, gbps=4 * 16384 * 7168 / t / 1e9, times=ts)
  n = 8192
  ab = [(jax.random.normal(k, (n, n), jnp.bfloat16),
         jax.random.normal(jax.random.fold_in(k, 1), (n, n), jnp.bfloat16)) for k in keys]
  mm = jax.jit(lambda a, b: a @ b)
  t, ts = median_time(mm, ab, runs=20)
  record("matmul_bf16_8192", ms=t * 1e3, tflops=2 * n**3 / t / 1e12, times=ts)


def _capacity_matmul(x, w, sizes, capacity):
  """Reference: every group padded to ``capacity`` rows, one batched matmul."""
  e = w.shape[0]
  start = jnp.cumsum(sizes) - sizes
  rows = start[:, None] + jnp.arange(capacity)[None]
  valid = jnp.arange(capacity)[None] < sizes[:, None]
  xg = jnp.where(valid[..., None], jnp.take(x, jnp.minimum(rows, x.shape[0] - 1), axis=0), 0)
  y = jnp.einsum("ecd,edf->ecf", xg, w, preferred_element_type=jnp.float32).astype(x.dtype)
  out = jnp.zeros((x.shape[0], w.shape[-1]), x.dtype)
  return out.at[jnp.where(valid, rows, x.shape[0]).reshape(-1)].set(
      y.reshape(e * capacity, -1), mode="drop")


def moe_layer(tokens=16384):
  p = moe_problem(tokens)
  x, weights, ids, gate, up, down, dy = (p[n] for n in ("x", "weights", "ids", "gate", "up",
                                                       "down", "dy"))
  counts = np.asarray(jnp.bincount(ids.reshape(-1), length=E))
  capacity = int(-(-counts.max() // 128) * 128)
  imbalance = float(counts.max() / counts.mean())
  routed_flops = 3 * 2 * tokens * K * 3 * D * F_TRUE
  impls = {
      "tiled": grouped_gemm.padded_grouped_matmul,
      "ragged_dot": lambda a, b, s: jax.lax.ragged_dot(a, b, s),
      "capacity_padded": lambda a, b, s: _capacity_matmul(a, b, s, capacity),
      "pallas": grouped_matmul_triton.grouped_matmul,
  }
  for name, gm in impls.items():
    def loss(x, gate, up, down, gm=gm):
      y = moe.experts_dispatch(x, weights, ids, gate, up, down, grouped_matmul=gm)
      return jnp.sum(y.astype(jnp.float32) * dy)
    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    try:
      t, ts = median_time(fn, [(x, gate, up, down)], runs=10)
    except Exception as err:  # pylint: disable=broad-except
      record(f"moe_fwd_bwd_{name}", error=str(err).splitlines()[0][:200])
      continue
    record(f"moe_fwd_bwd_{name}", ms=t * 1e3, routed_tflops=routed_flops / t / 1e12,
           imbalance_max_over_mean=imbalance, capacity=capacity, times=ts)


def _setup_2b(batch, seq):
  cfg = mc.deepseek_moe_2b(expert_pad_to=896)
  params = jax.jit(dm.init, static_argnums=0)(cfg, jax.random.key(0))
  toks = [jax.random.randint(jax.random.key(i), (batch, seq), 0, cfg.vocab_size)
          for i in range(3)]
  return cfg, params, toks


def _peak_gib(missing: float = float("nan")) -> float:
  """The device's peak allocation so far (GiB; ``missing`` where the backend keeps no
  stats)."""
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use", missing * 2**30) / 2**30


def train_step(batch=8, seq=2048, moe_impl="dispatch", scan=False, moments_dtype=None):
  cfg, params, toks = _setup_2b(batch, seq)
  tx = optim.optimizer(optim.OptimConfig(), moments_dtype=moments_dtype)
  mesh = mesh_lib.data_mesh()
  state = step_lib.init_state(params, tx)
  model = deepseek_model.model(cfg, deepseek_model.Options(moe_impl, scan=scan or None))
  fn = jax.jit(step_lib.make_train_step(model, tx), donate_argnums=0)
  holder = {"state": state}

  def run(tokens):
    holder["state"], m = fn(holder["state"], tokens)
    return m["loss"]

  t, ts = median_time(run, [(x,) for x in toks], runs=10)
  tps = batch * seq / t
  peak = flops.peak_flops(jax.devices()[0].device_kind)
  record("train_step_2b" + ("_scan" if scan else "") + (f"_{moments_dtype}_moments"
                                                        if moments_dtype else ""),
         moe_impl=moe_impl, batch=batch,
         seq=seq, ms=t * 1e3, tokens_per_s=tps, peak_gib=_peak_gib(),
         model_tflops=tps * flops.flops_per_token(model, seq) / 1e12,
         mfu=flops.mfu(tps, model, seq, peak, 1) or float("nan"), times=ts)
  del mesh


PAIRED = ("attn_l0-8_e4m3", "moe_l0-8_e4m3", "gemm:fp32_blockwise")


def paired_eval(batch=8, seq=2048, moe_impl="dispatch", policies=PAIRED, scan=False):
  cfg, params, toks = _setup_2b(batch, seq)
  mesh = mesh_lib.data_mesh()
  policies = [pl.parse_policy(n) for n in policies]
  model = deepseek_model.model(cfg, deepseek_model.Options(scan=scan or None))
  ev = paired.PairedEvaluator(model, policies, mesh, moe_impl)
  t_base, ts = median_time(ev.baseline, [(params, x) for x in toks], runs=8)
  record("paired_bf16_grad", moe_impl=moe_impl, batch=batch, seq=seq, scan=scan,
         ms=t_base * 1e3, times=ts)
  base = ev.baseline(params, toks[0])  # 8 GB of gradients: one batch, reused
  for p in policies:
    t, ts = median_time(lambda params, x, b, p=p: ev.variant(p.name, params, x, b),
                  [(params, toks[0], base)], runs=8)
    record(f"paired_{p.name}", ms=t * 1e3,
           ratio_to_two_bf16=(t_base + t) / (2 * t_base), times=ts)


def memory(seq=2048, moe_impl="dispatch"):
  cfg = mc.deepseek_moe_2b(expert_pad_to=896)
  params = jax.jit(dm.init, static_argnums=0)(cfg, jax.random.key(0))
  mesh = mesh_lib.data_mesh()
  ev = paired.PairedEvaluator(deepseek_model.model(cfg), [pl.parse_policy("moe_l0-8_e4m3")],
                              mesh, moe_impl)
  fits = {}
  for batch in (1, 2, 4, 8, 16):
    tokens = jax.random.randint(jax.random.key(0), (batch, seq), 0, cfg.vocab_size)
    try:
      base = ev.baseline(params, tokens)
      jax.block_until_ready(ev.variant("moe_l0-8_e4m3", params, tokens, base))
      fits[batch] = _peak_gib(missing=0.0)
      del base
      jax.clear_caches()
    except Exception as err:  # pylint: disable=broad-except
      fits[batch] = f"failed: {str(err).splitlines()[0][:120]}"
      break
  record("paired_memory_2b", seq=seq, peak_gib_by_batch=json.dumps(fits))


def compile_memory(batches=(4, 8), seq=2048, moe_impl="dispatch"):
  """XLA's buffer sizes of the compiled paired-evaluation functions (no execution)."""
  cfg = mc.deepseek_moe_2b(expert_pad_to=896)
  mesh = mesh_lib.data_mesh()
  params = jax.eval_shape(lambda: dm.init(cfg, jax.random.key(0)))
  gib = lambda b: b / 2**30  # noqa: E731
  names = ("moe_l0-8_e4m3", "gemm:fp32_blockwise")
  ev = paired.PairedEvaluator(deepseek_model.model(cfg), [pl.parse_policy(n) for n in names],
                              mesh, moe_impl)
  for batch in batches:
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    with jax.set_mesh(mesh):
      base = jax.eval_shape(ev.baseline_jit, params, tokens)
    fns = {"bf16_grad": (ev.baseline_jit, (params, tokens))}
    fns.update({n: (ev.variant_jits[n], (params, tokens, base, ev.empty_state[n]))
                for n in names})
    for name, (fn, args) in fns.items():
      with jax.set_mesh(mesh):
        m = fn.lower(*args).compile().memory_analysis()
      record(f"memory_{name}_b{batch}", temp_gib=gib(m.temp_size_in_bytes),
             args_gib=gib(m.argument_size_in_bytes), out_gib=gib(m.output_size_in_bytes))


def scaling(batch=2, seq=2048, moe_impl="dispatch"):
  """Paired evaluation (BF16 grad + one site-grid variant) on 1 device vs all devices, at
  ``batch`` sequences per device: scaling efficiency = throughput(N) / (N x throughput(1))."""
  cfg = mc.deepseek_moe_2b(expert_pad_to=896)
  params = jax.jit(dm.init, static_argnums=0)(cfg, jax.random.key(0))
  policy = pl.parse_policy("moe_l0-8_e4m3")
  per_pair = {}
  for devices in (jax.devices()[:1], jax.devices()):
    n = len(devices)
    mesh = mesh_lib.data_mesh(devices)
    ev = paired.PairedEvaluator(deepseek_model.model(cfg), [policy], mesh, moe_impl)
    p = jax.device_put(params, mesh_lib.replicated(mesh))
    toks = [jax.device_put(jax.random.randint(jax.random.key(i), (batch * n, seq), 0,
                                              cfg.vocab_size), mesh_lib.batch_sharding(mesh))
            for i in range(2)]

    def pair(x, ev=ev, p=p):
      return ev.variant(policy.name, p, x, ev.baseline(p, x))["compare"]["global"]["rel_err"]

    t, ts = median_time(pair, [(x,) for x in toks], runs=8)
    per_pair[n] = t
    record(f"scaling_paired_{n}dev", batch_per_device=batch, seq=seq, ms=t * 1e3,
           tokens_per_s=batch * n * seq / t, times=ts)
    del p, toks, ev
  n = max(per_pair)
  if n > 1:
    record("scaling_efficiency", devices=n, efficiency=per_pair[1] / per_pair[n])


PARTS = {"ceilings": ceilings, "moe": moe_layer, "train": train_step, "paired": paired_eval,
         "memory": memory, "compile_memory": compile_memory, "scaling": scaling}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--parts", default="ceilings,moe")
  ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "perf.json"))
  ap.add_argument("--tokens", type=int, default=16384, help="MoE layer tokens")
  ap.add_argument("--batch", type=int, default=8, help="2B batch (sequences)")
  ap.add_argument("--seq", type=int, default=2048)
  ap.add_argument("--moe-impl", default="pallas", choices=["dispatch", "pallas"],
                  help="the 2B model's MoE GEMMs (train, paired, memory, scaling); 'dispatch' "
                       "(XLA's grouped GEMM) runs out of memory on one H100 at batch 8")
  ap.add_argument("--fuse-gate-up", action="store_true",
                  help="the routed experts' gate and up as one grouped GEMM (BF16 layers)")
  ap.add_argument("--scan-layers", action="store_true",
                  help="train and paired: alike consecutive layers as one lax.scan")
  ap.add_argument("--paired-policies", default=";".join(PAIRED),
                  help="policies of --parts=paired, separated by ';'")
  ap.add_argument("--moments-dtype", default=None, choices=["bfloat16"],
                  help="train: AdamW moments stored in this dtype (default float32)")
  args = ap.parse_args()
  if args.fuse_gate_up:
    _variants.fuse_gate_up()
  record("options", fuse_gate_up=args.fuse_gate_up, scan_layers=args.scan_layers)
  two_b = {"seq": args.seq, "moe_impl": args.moe_impl}
  scan = {"scan": args.scan_layers}
  train = {"batch": args.batch, "moments_dtype": args.moments_dtype, **two_b, **scan}
  kwargs = {"moe": {"tokens": args.tokens}, "train": train,
            "paired": {"batch": args.batch, "policies": args.paired_policies.split(";"),
                       **two_b, **scan}, "memory": two_b,
            "compile_memory": two_b, "scaling": {"batch": args.batch, **two_b}}
  print(f"devices: {jax.devices()} (jax {jax.__version__})", flush=True)
  for part in args.parts.split(","):
    t = time.perf_counter()
    try:
      PARTS[part](**kwargs.get(part, {}))
    except Exception as err:  # pylint: disable=broad-except
      record(f"{part}_failed", error=f"{type(err).__name__}: {str(err)[:300]}")
    print(f"[{part}: {time.perf_counter() - t:.0f} s wall incl. compilation]", flush=True)
    pathlib.Path(args.out).write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
  main()
