#!/usr/bin/env bash
# The 2B model's train step (PART=train) or paired evaluation (PART=paired) on one GPU and
# on all of them, the layer loop and the scan, one process per configuration
# (scripts/bench/data_parallel.py): the two one-GPU runs side by side on GPUs 0 and 1,
# then the N-GPU runs one after another. A JSON per run and one file of the logs in
# OUT_DIR (default $OUT).
#   PART=train bash scripts/gpu/data_parallel.sh [EXTRA BENCH FLAGS]
# GSPMD=1 also runs the one XLA-partitioned program over the global batch (train; killed
# after GSPMD_TIMEOUT s, default 240).
set -uo pipefail
part=${PART:-train}
out=${OUT_DIR:-${OUT:-.}}
n=$(nvidia-smi -L | wc -l)
logs=$(mktemp -d)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
bench() {  # NAME DEVICES [FLAGS...]
  local name=$1 devices=$2
  shift 2
  python3 scripts/bench/data_parallel.py --part="$part" --devices="$devices" \
    --out="$out/${part}_$name.json" "$@" >"$logs/$name.log" 2>&1
  echo "[$name: exit $?]"; grep -E "^(train|paired)_" "$logs/$name.log" | cut -c1-400
}
CUDA_VISIBLE_DEVICES=0 bench 1gpu_loop 1 "$@" &
CUDA_VISIBLE_DEVICES=1 bench 1gpu_scan 1 --scan-layers "$@" &
wait
bench "${n}gpu_loop" "$n" "$@"
bench "${n}gpu_scan" "$n" --scan-layers "$@"
if [[ ${GSPMD:-0} == 1 ]]; then
  timeout "${GSPMD_TIMEOUT:-240}" python3 scripts/bench/data_parallel.py --part="$part" \
    --devices="$n" --route=gspmd --out="$out/${part}_${n}gpu_loop_gspmd.json" "$@" \
    >"$logs/gspmd.log" 2>&1
  echo "[gspmd: exit $?]"; grep -E "^(train|paired)_" "$logs/gspmd.log" | cut -c1-400
fi
for f in "$logs"/*.log; do echo "== $f"; cat "$f"; done >"$out/${part}_logs.txt"
