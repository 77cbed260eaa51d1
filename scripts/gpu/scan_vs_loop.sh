#!/usr/bin/env bash
# The 2B train step on one GPU, the layer loop against the scan over stacked params
# (8 x 2048 tokens): each traced (scripts/bench/data_parallel.py --profile), then their
# kernels side by side (scripts/bench/kernel_diff.py). Results in $OUT.
#   bash scripts/gpu/scan_vs_loop.sh [EXTRA BENCH FLAGS...]
set -uo pipefail
out=${OUT:?set OUT}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
for v in loop scan; do
  flags=()
  [ "$v" = scan ] && flags=(--scan-layers)
  mkdir -p "$out/$v"
  OUT=$out/$v timeout "${LIMIT:-300}" python3 scripts/bench/data_parallel.py --part=train \
    --devices=1 --profile "${flags[@]}" "$@" --out="$out/$v/dp_train_1gpu.json" \
    2>&1 | grep -v "^I0000\|^W0000" | tail -n 20
done
python3 scripts/bench/kernel_diff.py "$out"/loop/trace_*.json.gz "$out"/scan/trace_*.json.gz \
  --labels=loop,scan --steps=2 | tee "$out/kernel_diff.txt" | head -n 60
