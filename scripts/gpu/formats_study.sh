#!/usr/bin/env bash
# Where a short study's wall time goes (docs/performance.md): the 2-layer DeepSeek-MoE at the
# 2B widths (layer 0 dense, layer 1 MoE), 100 training steps with checkpoints 0/50/100,
# `--policies=formats` on one batch of 4 x 512 tokens per checkpoint, 4-step branch-off
# runs. Runs the study twice in fresh folders: first on an empty persistent compilation
# cache (cold), then on the cache the first run filled (warm). With JAX_LOG_COMPILES=1 each
# log lists every function's tracing, lowering and XLA compile; SUMMARY sums them per run
# and counts the cache entries each run wrote:
#   bash scripts/gpu/formats_study.sh RESULTS [WORK_DIR]
set -uo pipefail
out=${1:?usage: formats_study.sh RESULTS [WORK_DIR]}
work=${2:-/tmp/formats_study}
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 JAX_LOG_COMPILES=1 FP8JAX_COMPILE_CACHE="$work/cache"
for run in cold warm; do
  before=$(find "$work/cache" -type f 2>/dev/null | wc -l)
  t0=$SECONDS
  python3 scripts/run.py fp8jax.experiments.study \
    --config=experiments/configs/train_2b8l_full.py \
    --config.model_overrides.num_hidden_layers=2 --config.train.steps=100 \
    --config.optim.total_steps=100 --config.optim.warmup_steps=20 \
    --config.train.save_every=50 --config.train.checkpoints=True --config.train.log_every=10 \
    --policies=formats --offsets=0 --batches=1 --batch_size=4 --branch_k=4 \
    --out="$work/$run" >"$out/$run.log" 2>&1
  rc=$?
  after=$(find "$work/cache" -type f 2>/dev/null | wc -l)
  echo "$run: exit $rc, wall $((SECONDS - t0)) s, cache entries written $((after - before))" \
    | tee -a "$out/summary.txt"
done
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import re, sys
for run in ("cold", "warm"):
  text = open(f"{sys.argv[1]}/{run}.log", errors="replace").read()
  sums = {}
  for what, pat in (("trace", r"Finished tracing (?:\+ transforming )?.*? in ([\d.e-]+) sec"),
                    ("lower", r"Finished jaxpr to MLIR module conversion .*? in ([\d.e-]+) sec"),
                    ("xla compile", r"Finished XLA compilation of .*? in ([\d.e-]+) sec")):
    times = [float(t) for t in re.findall(pat, text)]
    sums[what] = (len(times), sum(times))
  hits = len(re.findall(r"Persistent compilation cache hit", text))
  stages = re.findall(r"\[study\] (.*?) \((\d+) s\)", text)
  print(run, "together:", "; ".join(re.findall(r"\[\w+\] compiled \d+ functions in [\d.]+ s", text)))
  print(run, {k: f"{n} calls, {s:.1f} s" for k, (n, s) in sums.items()},
        f"persistent cache hits {hits} (an XLA compilation line of a hit is its load)")
  print(run, "stages:", "; ".join(f"{t} at {s} s" for t, s in stages))
PY
