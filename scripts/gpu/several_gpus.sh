#!/usr/bin/env bash
# The 2B model on 1, 2 and N GPUs with each layer's gradients averaged in the backward pass
# (data_parallel.mean_in_backward) against the whole gradient averaged after it (the
# trainer's default; on 2026-11-28 the bench's default was per_layer: these runs' names),
# the 2B model with FSDP per device, and the 16B model with FSDP on N (and 2) GPUs
# (scripts/bench/data_parallel.py, fsdp.py), one process per configuration; JSON per run
# and the logs in OUT_DIR (default $OUT).
#   STAGE=1 bash scripts/gpu/several_gpus.sh   # 2B: train and paired, per layer / at end
#   STAGE=2 bash scripts/gpu/several_gpus.sh   # 16B FSDP: batches BATCHES_16B per device
#                                              # (UNROLL_16B, REMAT_16B: the scan's options)
#   STAGE=3 bash scripts/gpu/several_gpus.sh   # 16B FSDP on 2 GPUs beside 2B on 1 GPU, then
#                                              # 2B replicated against FSDP on N GPUs (its
#                                              # weights gathered in float32, then BF16)
# No run starts unless its estimate (EST seconds) fits before DEADLINE (default 480) seconds
# from the start; each is stopped after LIMIT seconds (default 300). The 2026-11-28 runs
# (docs/performance/archive/2026-11-28_fsdp_per_device_profiles.md): STAGE=2 fits 4 H200s
# with UNROLL_16B=1 REMAT_16B=nothing_saveable (the defaults) at up to 2 sequences.
set -uo pipefail
out=${OUT_DIR:-${OUT:-.}}
n=$(nvidia-smi -L | wc -l)
logs=$(mktemp -d)
deadline=${DEADLINE:-480}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax-cache}
run() {  # EST NAME SCRIPT [FLAGS...]: one process, skipped if EST seconds do not fit
  local est=$1 name=$2 script=$3
  shift 3
  if ((SECONDS + est > deadline)); then echo "[$name: skipped at ${SECONDS} s]"; return; fi
  timeout "${LIMIT:-300}" python3 "scripts/bench/$script" --out="$out/$name.json" "$@" \
    >"$logs/$name.log" 2>&1
  echo "[$name: exit $? at ${SECONDS} s]"
  grep -E "^(train|paired|fsdp)_" "$logs/$name.log" | cut -c1-330
}
u=(--scan-layers --scan-unroll=0)
if [[ ${STAGE:-1} == 1 ]]; then
  (CUDA_VISIBLE_DEVICES=0 run 90 train_1gpu data_parallel.py --part=train --devices=1 "${u[@]}" \
     --reduce=per_layer) &
  (CUDA_VISIBLE_DEVICES=1 run 120 paired_1gpu data_parallel.py --part=paired --devices=1 "${u[@]}" \
     --reduce=per_layer) &
  (if ((n > 2)); then
     CUDA_VISIBLE_DEVICES=2,3 run 90 train_2gpu data_parallel.py --part=train --devices=2 \
       "${u[@]}" --reduce=per_layer
     CUDA_VISIBLE_DEVICES=2,3 run 90 train_2gpu_at_end data_parallel.py --part=train \
       --devices=2 "${u[@]}" --reduce=at_end
   fi) &
  wait
  run 80 "train_${n}gpu" data_parallel.py --part=train "${u[@]}" --reduce=per_layer
  run 80 "train_${n}gpu_at_end" data_parallel.py --part=train "${u[@]}" --reduce=at_end
  XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true \
    --xla_gpu_all_reduce_combine_threshold_bytes=134217728" \
    run 80 "train_${n}gpu_lhs128m" data_parallel.py --part=train "${u[@]}" --reduce=per_layer
  run 120 "paired_${n}gpu" data_parallel.py --part=paired "${u[@]}" --reduce=per_layer
  run 120 "paired_${n}gpu_at_end" data_parallel.py --part=paired "${u[@]}" --reduce=at_end
fi
if [[ ${STAGE:-1} == 2 ]]; then
  # Partitioned by XLA (the route before data_parallel.gather_in_forward), none fit at
  # 1 x 4096 on 4 H200s (2026-11-28): unrolled, XLA asked for 116.0 GiB beyond the 45.75
  # GiB of state per device; unrolled with remat, 61.0 GiB (the whole float32 gradient);
  # rolled with remat, the compile failed in a custom partitioner. Now per device: each
  # layer's weights gathered where it runs, its gradient reduce-scattered.
  LIMIT=${LIMIT:-$((deadline - 20))} run 200 "fsdp_16b_${n}gpu" fsdp.py \
    --batches="${BATCHES_16B:-1,2,4}" --scan-unroll="${UNROLL_16B:-1}" \
    --scan-remat="${REMAT_16B:-nothing_saveable}"
fi
if [[ ${STAGE:-1} == 3 ]]; then
  (CUDA_VISIBLE_DEVICES=0,1 LIMIT=330 run 300 fsdp_16b_2gpu fsdp.py --batches=1,2 \
     --scan-unroll=1 --scan-remat="${REMAT_16B:-nothing_saveable}") &
  (CUDA_VISIBLE_DEVICES=2 run 90 train_1gpu_at_end data_parallel.py --part=train --devices=1 \
     "${u[@]}") &
  wait
  run 90 "train_${n}gpu_at_end" data_parallel.py --part=train "${u[@]}"
  run 90 "fsdp_2b_${n}gpu" fsdp.py --model=deepseek_moe_2b --seq=2048 --batches=8 \
    --scan-unroll=0
  run 90 "fsdp_2b_${n}gpu_bf16_gather" fsdp.py --model=deepseek_moe_2b --seq=2048 \
    --batches=8 --scan-unroll=0 --gather-dtype=bfloat16 --profile
fi
for f in "$logs"/*.log; do echo "== $f"; cat "$f"; done >"$out/logs_stage${STAGE:-1}.txt"
