#!/usr/bin/env bash
# The 2B train step and paired evaluation, layer loop against the scan with params stored
# per layer and stored stacked (scripts/bench/data_parallel.py), one process per
# configuration: two lanes of one-GPU runs side by side on GPUs 0 and 1, then the N-GPU
# runs one after another. JSON per run and the logs in OUT_DIR (default $OUT).
#   STAGE=1|2 bash scripts/gpu/layer_stack.sh
set -uo pipefail
out=${OUT_DIR:-${OUT:-.}}
n=$(nvidia-smi -L | wc -l)
logs=$(mktemp -d)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
bench() {  # NAME PART DEVICES [FLAGS...]
  local name=$1 part=$2 devices=$3
  shift 3
  python3 scripts/bench/data_parallel.py --part="$part" --devices="$devices" \
    --out="$out/$name.json" "$@" >"$logs/$name.log" 2>&1
  echo "[$name: exit $?]"; grep -E "^(train|paired)_" "$logs/$name.log" | cut -c1-330
}
if [[ ${STAGE:-1} == 1 ]]; then
  (CUDA_VISIBLE_DEVICES=0 bench train_1gpu_loop train 1
   CUDA_VISIBLE_DEVICES=0 bench train_1gpu_scan_per_layer train 1 --scan-layers \
     --storage=per_layer) &
  (CUDA_VISIBLE_DEVICES=1 bench train_1gpu_stacked train 1 --scan-layers
   CUDA_VISIBLE_DEVICES=1 bench paired_1gpu_stacked paired 1 --scan-layers) &
  wait
  bench "train_${n}gpu_stacked" train "$n" --scan-layers
else
  (CUDA_VISIBLE_DEVICES=0 bench paired_1gpu_loop paired 1) &
  (CUDA_VISIBLE_DEVICES=1 bench paired_1gpu_scan_per_layer paired 1 --scan-layers \
     --storage=per_layer) &
  wait
  bench "paired_${n}gpu_stacked" paired "$n" --scan-layers
fi
for f in "$logs"/*.log; do echo "== $f"; cat "$f"; done >"$out/logs_stage${STAGE:-1}.txt"
