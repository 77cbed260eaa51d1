#!/usr/bin/env bash
# The noise floor and the noise-matched control at a gradient spike (docs/noise_floor.md):
# a deterministic 2-layer run at the 2B widths (the 100-step schedule, stopped at step 60,
# checkpoints every 10 steps), then the paired comparison of every checkpoint on one batch
# of 4 x 512 tokens: FP8 per-tensor and DeepSeek-V3 blockwise GEMMs, the blockwise recipe's
# noise-matched control and the floor; then the comparison of one checkpoint again, in a
# new folder: are its rows the same bits?
#   bash scripts/gpu/spike_floor.sh OUT_DIR [WORK_DIR]
set -uo pipefail
out=${1:?usage: spike_floor.sh OUT_DIR [WORK_DIR]}
work=${2:-/tmp/spike}
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=$work/cache \
  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1 \
  XLA_FLAGS="${XLA_FLAGS:---xla_gpu_autotune_level=0}"
run() { python3 scripts/run.py "$@"; }
t0=$SECONDS
run fp8jax.experiments.train --config=experiments/configs/train_2b8l_full.py \
  --config.model_overrides.num_hidden_layers=2 --config.train.steps=60 \
  --config.optim.total_steps=100 --config.optim.warmup_steps=20 --config.train.save_every=10 \
  --config.train.checkpoints=True --config.train.log_every=1 --config.train.deterministic=True \
  --workdir="$work/train" >"$out/train.log" 2>&1
echo "train: exit $? after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
cp "$work/train/metrics.jsonl" "$out/train_metrics.jsonl"
pols="gemm:fp8_tensor,gemm:fp32_blockwise,noise(gemm:fp32_blockwise)"
cmp=(--train_workdir="$work/train" --policies="$pols" --batches=1 --batch_size=4
     --moe_impl=pallas --deterministic --notelemetry)
t0=$SECONDS
run fp8jax.experiments.compare "${cmp[@]}" --out="$work/cmp" >"$out/compare.log" 2>&1
echo "compare: exit $? after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
for f in rows baseline; do cp "$work/cmp/$f.jsonl" "$out/$f.jsonl"; done
cp "$work/cmp/meta.json" "$out/meta.json"
t0=$SECONDS
run fp8jax.experiments.compare "${cmp[@]}" --steps=40 --out="$work/cmp_again" \
  >"$out/compare_again.log" 2>&1
echo "compare again: exit $? after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
python3 - "$work" <<'PY' | tee -a "$out/summary.txt"
import json, sys
w = sys.argv[1]
key = lambda r: (r["step"], r["offset"], r["batch"], r["policy"])
first = {key(r): r for r in map(json.loads, open(f"{w}/cmp/rows.jsonl"))}
again = [json.loads(l) for l in open(f"{w}/cmp_again/rows.jsonl")]
same = [r == first[key(r)] for r in again]
print(f"paired evaluation again: {sum(same)} of {len(same)} rows bit-identical")
PY
