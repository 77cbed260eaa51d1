#!/usr/bin/env bash
# The 2B BF16 train step (8 x 2048, Pallas MoE) and the paired evaluation in the layer loop
# and with the scan, and the levers on its MFU (docs/performance.md): one process per
# measurement, in sequence on one GPU, each writing RESULTS/<name>.json and its log.
#   bash scripts/gpu/train_step_levers.sh RESULTS [MEASUREMENTS...]
# MEASUREMENTS (default: all, in this order): train_loop train_scan train_scan_fused
# profile_scan profile_scan_fused paired_scan paired_loop.
set -uo pipefail
out=${1:?usage: train_step_levers.sh RESULTS [MEASUREMENTS...]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
todo=("$@")
((${#todo[@]})) || todo=(train_loop train_scan train_scan_fused profile_scan
                         profile_scan_fused paired_scan paired_loop)
for m in "${todo[@]}"; do
  case $m in
    train_loop) cmd=(scripts/bench/study_perf.py --parts=ceilings,train) ;;
    train_scan) cmd=(scripts/bench/study_perf.py --parts=train --scan-layers) ;;
    train_scan_fused) cmd=(scripts/bench/study_perf.py --parts=train --scan-layers --fuse-gate-up) ;;
    train_loop_fused) cmd=(scripts/bench/study_perf.py --parts=train --fuse-gate-up) ;;
    profile_scan) cmd=(scripts/bench/profile_step.py --parts=train --scan-layers) ;;
    profile_scan_fused) cmd=(scripts/bench/profile_step.py --parts=train --scan-layers --fuse-gate-up) ;;
    profile_loop) cmd=(scripts/bench/profile_step.py --parts=train) ;;
    paired_scan) cmd=(scripts/bench/study_perf.py --parts=paired --scan-layers) ;;
    paired_loop) cmd=(scripts/bench/study_perf.py --parts=paired) ;;
    *) echo "unknown measurement $m"; exit 2 ;;
  esac
  t0=$SECONDS
  case ${cmd[0]} in
    *study_perf.py) python3 "${cmd[@]}" --out="$out/$m.json" >"$out/$m.log" 2>&1 ;;
    *) mkdir -p "$out/$m" && OUT="$out/$m" python3 "${cmd[@]}" >"$out/$m.log" 2>&1 ;;
  esac
  echo "$m: exit $? after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
done
