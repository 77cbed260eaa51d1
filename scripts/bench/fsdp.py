"""A train step with params and optimizer state split over the GPUs (FSDP, ``train.fsdp``):
the 16B model's step time and peak memory per device at growing batches, until one does
not fit. docs/performance.md has the method.

    python scripts/bench/fsdp.py [--model=deepseek_moe_16b] [--batches=1,2,4] [--seq=4096]
        [--route=per_device|gspmd] [--moe-impl=pallas] [--scan-unroll=0]
        [--scan-remat=POLICY] [--profile] [--out=$OUT/fsdp.json]

The step is the training binary's with ``train.fsdp`` (``fp8jax.train.loop.build_step``):
the state laid out by ``mesh.fsdp_sharding``, the layers scanned over params stored
stacked, and per device (``--route=per_device``, the default) each layer's weights
all-gathered where it runs and its gradient reduce-scattered
(``data_parallel.gather_in_forward``). ``--route=gspmd`` is the binary's route before
that: one program over the global batch that XLA partitions, the MoE through XLA's
dispatch (``moe_groups`` = devices). ``--scan-unroll`` and ``--scan-remat`` set
``layer_scan.ScanOptions`` (rolled, ``--scan-unroll=1``, the all-gather of a layer's weights
stays in its iteration). ``--batches`` are sequences per device, tried
in order on one state (the first is initialised once); a batch that fails (out of memory)
is recorded with its error and ends the run. The JSON is written after each batch.
``--model=deepseek_moe_2b`` builds the 2B model as ``data_parallel.py`` and
``train_2b_c4.py`` do (experts padded to 896, so the Mosaic grouped GEMMs take them).
``--profile`` traces 2 steps of the first batch: each GPU's collective time, hidden behind
compute or exposed (``comm_overlap.py``), and the trace in $OUT.
"""

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _repo  # noqa: E402,F401
from _results import RESULTS, record  # noqa: E402
from _timing import median_time  # noqa: E402
from data_parallel import _compiled, _peaks_gib, _profile, _tokens, model_config  # noqa: E402,E501
import jax  # noqa: E402

from fp8jax.models import deepseek_model, layer_scan  # noqa: E402
from fp8jax.models import policy as pl  # noqa: E402
from fp8jax.train import flops, optim  # noqa: E402
from fp8jax.train import mesh as mesh_lib  # noqa: E402
from fp8jax.train import step as step_lib  # noqa: E402


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="deepseek_moe_16b", help="a models.config name")
  ap.add_argument("--batches", default="1,2,4", help="sequences per device, in order")
  ap.add_argument("--seq", type=int, default=4096)
  ap.add_argument("--devices", type=int, default=0, help="0: all")
  ap.add_argument("--route", choices=["per_device", "gspmd"], default="per_device")
  ap.add_argument("--moe-impl", default="pallas", choices=["pallas", "dispatch"],
                  help="pallas: per device only (XLA partitions no Pallas kernel)")
  ap.add_argument("--scan-unroll", type=int, default=0, help="layers per loop iteration "
                  "(0: all)")
  ap.add_argument("--scan-remat", default=None, help="a jax.checkpoint_policies name")
  ap.add_argument("--gather-dtype", default=None, help="per_device: the split weights "
                  "cast to this dtype before their gather (bfloat16: half the bytes)")
  ap.add_argument("--profile", action="store_true", help="trace 2 steps of the first "
                  "batch; each GPU's collective time hidden behind compute")
  ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "fsdp.json"))
  args = ap.parse_args()
  devices = jax.devices()[:args.devices or None]
  n, out = len(devices), pathlib.Path(args.out)
  print(f"devices: {devices} (jax {jax.__version__})", flush=True)
  cfg = model_config(args.model)
  mesh = mesh_lib.data_mesh(devices)
  tx = optim.optimizer(optim.OptimConfig())
  per_device = args.route == "per_device"
  model = deepseek_model.model(cfg, deepseek_model.Options(
      args.moe_impl if per_device else "dispatch", 1 if per_device else n,
      scan=layer_scan.ScanOptions(args.scan_unroll, args.scan_remat)))
  init = step_lib.seeded_init(model, tx, pl.BF16, stacked=True)
  abstract = jax.eval_shape(lambda: init(0))
  sharding = mesh_lib.fsdp_sharding(abstract, mesh)
  step = mesh_lib.shard_step(step_lib.make_train_step(
      model, tx, mesh=mesh if per_device else None,
      param_specs=jax.tree.map(lambda s: s.spec, sharding.params) if per_device else None,
      gather_dtype=args.gather_dtype if per_device else None),
      mesh, sharding)
  tag = (f"{args.route}_u{args.scan_unroll}" + (f"_{args.gather_dtype}" if args.gather_dtype
                                                else "")
         + (f"_{args.scan_remat}" if args.scan_remat else ""))
  t = time.perf_counter()
  holder = {"state": jax.jit(lambda: init(0), out_shardings=sharding)()}
  jax.block_until_ready(holder["state"])
  record(f"fsdp_{n}gpu_init", seconds=time.perf_counter() - t,
         params=sum(x.size for x in jax.tree.leaves(abstract.params)),
         state_gib_per_device=sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract))
         / n / 2**30,
         peak_gib=_peaks_gib(devices), device_kind=devices[0].device_kind)
  peak = flops.peak_flops(devices[0].device_kind)
  for batch in (int(b) for b in args.batches.split(",")):
    name = f"fsdp_{n}gpu_{tag}_b{batch}x{args.seq}"
    try:
      toks = _tokens(cfg, mesh, n, batch, args.seq)
      t = time.perf_counter()
      lowered = step.lower(holder["state"], toks[0])
      trace_s = time.perf_counter() - t
      compiled, compile_s, kinds, temp = _compiled(lowered)

      def run(tokens, compiled=compiled):
        holder["state"], m = compiled(holder["state"], tokens)
        return m["loss"]

      t_step, ts = median_time(run, [(x,) for x in toks], runs=5)
      tps = batch * n * args.seq / t_step
      if args.profile and batch == int(args.batches.split(",")[0]):
        _profile(run, toks[0], name)
      record(name, devices=n, batch_per_device=batch, seq=args.seq, trace_s=trace_s,
             compile_s=compile_s, ms=t_step * 1e3, tokens_per_s=tps,
             mfu_per_gpu=flops.mfu(tps, model, args.seq, peak, n) or float("nan"),
             peak_gib=_peaks_gib(devices), temp_gib=temp, collectives=kinds, times=ts)
    except Exception as err:  # pylint: disable=broad-except
      record(f"{name}_failed", error=f"{type(err).__name__}: {str(err)[:600]}")
      break
    finally:
      out.write_text(json.dumps(RESULTS, indent=1))
  out.write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
  main()
