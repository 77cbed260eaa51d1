"""The 2B model's train step and paired evaluation on 1..N GPUs, one configuration per
process (so that each peak memory is its own); docs/performance.md has the method.

    python scripts/bench/data_parallel.py --part=train --devices=2 [--scan-layers]
        [--storage=stacked|per_layer] [--scan-unroll=0] [--scan-remat=POLICY]
        [--route=per_device|gspmd] [--reduce=at_end|per_layer] [--batch=8]
        [--guard=inputs|outputs] [--profile] [--out=$OUT/dp_train_2.json]

``--scan-layers`` scans the runs of alike layers; ``--storage`` says how their params are
stored then: stacked per run (``fp8jax.models.layer_stack``, the default: the train state,
or the evaluator's ``store``) or per layer (stacked in every step, as before stacked
storage); ``--scan-unroll`` and ``--scan-remat`` set ``layer_scan.ScanOptions``.

``--batch`` is per device (sequences of ``--seq`` tokens): the global batch is
``batch x devices`` (weak scaling). ``--route=gspmd`` is the one program over the global
batch that XLA partitions (the route FSDP takes), ``per_device`` the data-parallel
replicas of ``fp8jax.train.data_parallel``. ``--reduce``: the replicas average the whole
gradient after the backward pass (``at_end``, the default, as the trainer does) or each
layer's gradients in it (``per_layer``: ``data_parallel.mean_in_backward``).

Recorded: the tracing (``lower``) and compile times (the paired functions compiled
side by side in threads, as the sweep compiles them), the median step time after a
warm-up, tokens/s,
MFU per GPU (``fp8jax.train.flops``), each device's peak memory and XLA's temp size;
with ``--profile`` (train), each GPU's collective time hidden behind its other kernels
and exposed, from 2 traced steps (``comm_overlap.py``), and the trace in $OUT.
"""

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _repo  # noqa: E402,F401
from _results import RESULTS, record  # noqa: E402
from _timing import median_time  # noqa: E402
import comm_overlap  # noqa: E402
import jax  # noqa: E402

from fp8jax.models import config as mc  # noqa: E402
from fp8jax.models import deepseek_model, layer_scan, layer_stack  # noqa: E402
from fp8jax.models import deepseek_moe as dm  # noqa: E402
from fp8jax.models import policy as pl  # noqa: E402
from fp8jax.study.comparison import paired  # noqa: E402
from fp8jax.train import data_parallel as dp  # noqa: E402
from fp8jax.train import flops, optim  # noqa: E402
from fp8jax.train import mesh as mesh_lib  # noqa: E402
from fp8jax.train import step as step_lib  # noqa: E402

POLICIES = ("moe_l0-8_e4m3", "gemm:fp32_blockwise")


def _peaks_gib(devices) -> list[float]:
  return [(d.memory_stats() or {}).get("peak_bytes_in_use", float("nan")) / 2**30
          for d in devices]


def model_config(name):
  """The models.config ``name``; the 2B model's experts zero-padded to width 896 (exact),
  as ``train_2b_c4.py`` stores them, so that the Mosaic grouped GEMMs take them."""
  return (mc.deepseek_moe_2b(expert_pad_to=896) if name == "deepseek_moe_2b"
          else mc.get_config(name))


def _compiled(lowered):
  """(compiled, seconds to compile, its collectives, XLA's temp GiB)."""
  t = time.perf_counter()
  compiled = lowered.compile()
  seconds = time.perf_counter() - t
  kinds = {k: len(v) for k, v in dp.collectives(compiled).items()}
  return compiled, seconds, kinds, compiled.memory_analysis().temp_size_in_bytes / 2**30


def _tokens(cfg, mesh, n, batch, seq):
  return [mesh_lib.global_batch(jax.random.randint(jax.random.key(i), (batch * n, seq), 0,
                                                   cfg.vocab_size), mesh) for i in range(3)]


def _tag(scan, storage, reduce="at_end"):
  end = "_reduce_per_layer" if reduce == "per_layer" else ""
  if not scan:
    return "loop" + end
  tag = ("scan" if storage == "stacked" else "scan_per_layer") + end
  if scan.unroll:  # the default, 0, unrolls the whole run
    tag += "_rolled" if scan.unroll == 1 else f"_unroll{scan.unroll}"
  return tag + (f"_remat_{scan.remat}" if scan.remat else "")


def _profile(run, tokens, name, steps=2):
  """Traces ``steps`` steps; records each GPU's collective time hidden behind compute
  (comm_overlap.py) and keeps the trace in $OUT."""
  tmp = pathlib.Path(tempfile.mkdtemp())
  with jax.profiler.trace(str(tmp), create_perfetto_trace=True):
    for _ in range(steps):
      loss = run(tokens)
    jax.block_until_ready(loss)
  trace = next(tmp.rglob("perfetto_trace.json.gz"))
  if os.environ.get("OUT"):
    shutil.copy(trace, pathlib.Path(os.environ["OUT"]) / f"trace_{name}.json.gz")
  for gpu, row in comm_overlap.report(trace, steps).items():
    record(f"{name}_overlap_{gpu.replace(' ', '_').replace('/', '_')}", **row)


def train(cfg, mesh, n, batch, seq, scan, route, moe_impl, storage, reduce, profile=False,
          guard="inputs"):
  tx = optim.optimizer(optim.OptimConfig())
  runs = dm.layer_runs(cfg, pl.BF16) if scan and storage == "stacked" else None
  store = (lambda p: layer_stack.stack(p, runs)) if runs else (lambda p: p)
  per_device = route == "per_device"
  model = deepseek_model.model(cfg, deepseek_model.Options(
      moe_impl, 1 if per_device else n, scan=scan or None))
  step = mesh_lib.shard_step(step_lib.make_train_step(
      model, tx, mesh=mesh if per_device else None, reduce_per_layer=reduce == "per_layer",
      check_update=guard == "outputs"), mesh)
  init = jax.jit(lambda k: step_lib.init_state(store(dm.init(cfg, k)), tx),
                 out_shardings=mesh_lib.replicated(mesh))
  holder = {"state": init(jax.random.key(0))}
  toks = _tokens(cfg, mesh, n, batch, seq)
  t = time.perf_counter()
  lowered = step.lower(holder["state"], toks[0])
  trace_s = time.perf_counter() - t
  compiled, compile_s, kinds, temp = _compiled(lowered)

  def run(tokens):
    holder["state"], m = compiled(holder["state"], tokens)
    return m["loss"]

  t_step, ts = median_time(run, [(x,) for x in toks], runs=10)
  tps = batch * n * seq / t_step
  peak = flops.peak_flops(jax.devices()[0].device_kind)
  name = f"train_{n}gpu_{_tag(scan, storage, reduce)}_{route}"
  name += "_check_update" if guard == "outputs" else ""
  if profile:
    _profile(run, toks[0], name)
  record(name, devices=n,
         batch_per_device=batch, seq=seq, trace_s=trace_s, compile_s=compile_s,
         ms=t_step * 1e3, tokens_per_s=tps,
         mfu_per_gpu=flops.mfu(tps, model, seq, peak, n) or float("nan"),
         peak_gib=_peaks_gib(mesh.devices.flat), temp_gib=temp, collectives=kinds, times=ts)


def paired_eval(cfg, mesh, n, batch, seq, scan, route, moe_impl, storage, reduce,
                profile=False):
  del route, profile  # the evaluator always runs per device; --profile: train only
  tag = _tag(scan, storage, reduce)
  last = cfg.num_hidden_layers - 1
  first = 0 if cfg.is_moe_layer(0) else 1
  policies = [pl.parse_policy(p.replace("l0-8", f"l{first}-{last}")) for p in POLICIES]
  model = dataclasses.replace(deepseek_model.model(cfg, deepseek_model.Options(
      scan=scan or None)), param_transform=reduce == "per_layer")
  ev = paired.PairedEvaluator(model, policies, mesh, moe_impl, telemetry=False)
  params = jax.jit(lambda k: dm.init(cfg, k), out_shardings=mesh_lib.replicated(mesh))(
      jax.random.key(0))
  if storage == "stacked":
    params = ev.store(params)
  toks = _tokens(cfg, mesh, n, batch, seq)
  lowerings = ev.lowerings(params, toks[0], [p.name for p in policies])
  lowered = {}
  for label, lower in lowerings.items():
    t = time.perf_counter()
    lowered[label] = lower()
    record(f"paired_{n}gpu_{tag}_trace_{label.replace(' ', '_')}",
           trace_s=time.perf_counter() - t)
  t = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(len(lowered)) as pool:  # as the sweep does
    done = dict(zip(lowered, pool.map(_compiled, lowered.values())))
  record(f"paired_{n}gpu_{tag}_compile_all", wall_s=time.perf_counter() - t,
         functions=len(done))
  compiled = {}
  for label, (fn, compile_s, kinds, temp) in done.items():
    compiled[label] = fn
    record(f"paired_{n}gpu_{tag}_compile_{label.replace(' ', '_')}", compile_s=compile_s,
           temp_gib=temp, collectives=kinds)
  base_fn = compiled["the BF16 baseline"]
  t_base, ts = median_time(base_fn, [(params, x) for x in toks], runs=6)
  record(f"paired_{n}gpu_{tag}_bf16_grad", devices=n,
         batch_per_device=batch, seq=seq, ms=t_base * 1e3,
         tokens_per_s=batch * n * seq / t_base, times=ts)
  base = base_fn(params, toks[0])  # its routing replicated, as the evaluator passes it on
  base = base._replace(routing=jax.device_put(base.routing, mesh_lib.replicated(mesh)))
  for p in policies:
    fn = compiled[f"policy {p.name}"]
    t, ts = median_time(lambda x, fn=fn, p=p: fn(params, x, base, ev.empty_state[p.name]),
                        [(toks[0],)], runs=6)
    record(f"paired_{n}gpu_{tag}_{p.name}", ms=t * 1e3,
           ratio_to_two_bf16=(t_base + t) / (2 * t_base), times=ts)
  record(f"paired_{n}gpu_{tag}_peak", peak_gib=_peaks_gib(
      mesh.devices.flat))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--part", choices=["train", "paired"], default="train")
  ap.add_argument("--devices", type=int, default=0, help="0: all")
  ap.add_argument("--batch", type=int, default=8, help="sequences per device")
  ap.add_argument("--seq", type=int, default=2048)
  ap.add_argument("--scan-layers", action="store_true")
  ap.add_argument("--storage", choices=["stacked", "per_layer"], default="stacked",
                  help="with --scan-layers: the params stored stacked per run, or per layer")
  ap.add_argument("--scan-unroll", type=int, default=0,
                  help="with --scan-layers: layers per loop iteration (0: all, the default)")
  ap.add_argument("--scan-remat", default=None, help="with --scan-layers: a "
                  "jax.checkpoint_policies name (what a layer keeps for the backward pass)")
  ap.add_argument("--route", choices=["per_device", "gspmd"], default="per_device")
  ap.add_argument("--reduce", choices=["at_end", "per_layer"], default="at_end",
                  help="the replicas' gradients averaged after the backward pass, or per "
                  "layer in it")
  ap.add_argument("--moe-impl", default="pallas", choices=["dispatch", "pallas"])
  ap.add_argument("--model", default="deepseek_moe_2b", help="a models.config name "
                  "(tiny: a CPU smoke run)")
  ap.add_argument("--profile", action="store_true", help="train: trace 2 steps; each "
                  "GPU's collective time hidden behind compute (comm_overlap.py)")
  ap.add_argument("--guard", choices=["inputs", "outputs"], default="inputs",
                  help="train: the non-finite guard checks what the step reads (inputs, "
                  "the default) or also the new params (outputs: make_train_step's "
                  "check_update)")
  ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "dp.json"))
  args = ap.parse_args()
  devices = jax.devices()[:args.devices or None]
  n = len(devices)
  print(f"devices: {devices} (jax {jax.__version__})", flush=True)
  cfg = model_config(args.model)
  mesh = mesh_lib.data_mesh(devices)
  part = {"train": functools.partial(train, guard=args.guard),
          "paired": paired_eval}[args.part]
  t = time.perf_counter()
  try:
    scan = (layer_scan.ScanOptions(args.scan_unroll, args.scan_remat) if args.scan_layers
            else None)
    part(cfg, mesh, n, args.batch, args.seq, scan, args.route, args.moe_impl, args.storage,
         args.reduce, args.profile)
  except Exception as err:  # pylint: disable=broad-except
    record(f"{args.part}_{n}gpu_failed", error=f"{type(err).__name__}: {str(err)[:400]}")
  record(f"{args.part}_{n}gpu_wall", seconds=time.perf_counter() - t,
         device_kind=devices[0].device_kind)
  pathlib.Path(args.out).write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
  main()
