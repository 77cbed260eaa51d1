#!/usr/bin/env bash
# The 2B train step and paired evaluation, layer loop against the scan with params stored
# per layer and stored stacked (scripts/bench/data_parallel.py), one process per
# configuration: the one-GPU runs side by side, one lane per GPU, then the runs over
# several GPUs one after another. JSON per run and the logs in OUT_DIR (default $OUT).
# Each run is stopped after LIMIT seconds (default 420) so that the others still report.
# STAGE=2 also tries the scan's unrolling and rematerialization (layer_scan.ScanOptions).
# STAGE=3: the scan unrolled, on 1, 2 and N GPUs; STAGE=4: the loop and the scan
# unrolled, side by side on one machine; STAGE=5: N GPUs, XLA's latency-hiding scheduler
# and all-reduces combined up to 32 MiB against the defaults.
#   STAGE=1|2|3|4|5 bash scripts/gpu/layer_stack.sh
set -uo pipefail
out=${OUT_DIR:-${OUT:-.}}
n=$(nvidia-smi -L | wc -l)
logs=$(mktemp -d)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax-cache}
bench() {  # NAME PART DEVICES [FLAGS...]
  local name=$1 part=$2 devices=$3
  shift 3
  timeout "${LIMIT:-420}" python3 scripts/bench/data_parallel.py --part="$part" \
    --devices="$devices" --out="$out/$name.json" "$@" >"$logs/$name.log" 2>&1
  echo "[$name: exit $?]"; grep -E "^(train|paired)_" "$logs/$name.log" | cut -c1-330
}
lanes() {  # JOB... (each "NAME PART DEVICES FLAGS"): one-GPU jobs spread over the GPUs
  local lane i jobs=("$@")
  for ((lane = 0; lane < n && lane < ${#jobs[@]}; lane++)); do
    (for ((i = lane; i < ${#jobs[@]}; i += n)); do
       # shellcheck disable=SC2086
       CUDA_VISIBLE_DEVICES=$lane bench ${jobs[i]}
     done) &
  done
  wait
}
if [[ ${STAGE:-1} == 1 ]]; then
  r="--scan-layers --scan-unroll=1"  # rolled
  lanes "train_1gpu_loop train 1" \
        "train_1gpu_stacked train 1 $r" \
        "train_1gpu_scan_per_layer train 1 $r --storage=per_layer" \
        "paired_1gpu_stacked paired 1 $r"
  bench "train_${n}gpu_stacked" train "$n" $r
elif [[ $STAGE == 2 ]]; then  # the paired loop, and the stacked scan's unrolling and rematerialization
  s="train 1 --scan-layers"
  lanes "train_1gpu_unroll2 $s --scan-unroll=2" \
        "train_1gpu_remat_dots $s --scan-unroll=1 --scan-remat=dots_saveable" \
        "train_1gpu_unroll_all $s --scan-unroll=0" \
        "paired_1gpu_loop paired 1" \
        "train_1gpu_remat_nothing $s --scan-unroll=1 --scan-remat=nothing_saveable" \
        "train_1gpu_unroll2_remat_dots $s --scan-unroll=2 --scan-remat=dots_saveable"
  bench "paired_${n}gpu_stacked" paired "$n" --scan-layers --scan-unroll=1
  if ((n > 2)); then
    CUDA_VISIBLE_DEVICES=0,1 bench train_2gpu_stacked train 2 --scan-layers --scan-unroll=1
  fi
fi
if [[ ${STAGE:-1} == 3 ]]; then  # the scan unrolled (ScanOptions(unroll=0)) on 1, 2, N GPUs
  u="--scan-layers --scan-unroll=0"
  (CUDA_VISIBLE_DEVICES=0 bench paired_1gpu_unroll_all paired 1 $u) &
  (CUDA_VISIBLE_DEVICES=2,3 bench train_2gpu_unroll_all train 2 $u) &
  wait
  bench "train_${n}gpu_unroll_all" train "$n" $u
  bench "paired_${n}gpu_unroll_all" paired "$n" $u
fi
if [[ ${STAGE:-1} == 4 ]]; then  # the loop and the scan unrolled on one machine
  u="--scan-layers --scan-unroll=0"
  lanes "train_1gpu_loop train 1" "train_1gpu_unroll_all train 1 $u" \
        "paired_1gpu_loop paired 1" "paired_1gpu_unroll_all paired 1 $u"
fi
if [[ ${STAGE:-1} == 5 ]]; then  # the gradient all-reduce overlapped with the backward pass?
  u="--scan-layers --scan-unroll=0"
  bench "train_${n}gpu_unroll_all" train "$n" $u
  XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true \
    --xla_gpu_all_reduce_combine_threshold_bytes=33554432" \
    bench "train_${n}gpu_unroll_all_lhs" train "$n" $u
fi
for f in "$logs"/*.log; do echo "== $f"; cat "$f"; done >"$out/logs_stage${STAGE:-1}.txt"
