#!/usr/bin/env bash
# Where the GEMM recipe's pass spends its time beyond the kernels
# (docs/performance/archive/2026-11-26_pair_fusions_wgrad.md):
# a profile of the 2B paired evaluation of gemm:fp32_blockwise (profile_step.py) with an
# XLA dump, each of its kernels beside the bytes it moves (fusion_bytes.py), then the 2B
# BF16 train step with float32 and with BF16 AdamW moments (study_perf.py).
#   bash scripts/gpu/pair_fusions.sh RESULTS [POLICY]
set -uo pipefail
out=${1:?usage: pair_fusions.sh RESULTS [POLICY]}
policy=${2:-gemm:fp32_blockwise}
mkdir -p "$out/profile"
export PYTHONUNBUFFERED=1
dump=$(mktemp -d)
t0=$SECONDS
XLA_FLAGS="--xla_dump_to=$dump --xla_dump_hlo_as_text" OUT="$out/profile" \
  python3 scripts/bench/profile_step.py --parts=paired --paired-policy="$policy" \
  >"$out/profile.log" 2>&1
echo "profile: exit $? after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
for trace in "$out"/profile/trace_variant_*.json.gz; do
  python3 scripts/bench/fusion_bytes.py "$trace" "$dump" --top=80 \
    --json="$out/variant_fusions.json" >"$out/variant_fusions.txt" 2>&1
  module=$(sed -n 's/^module \([^;]*\);.*/\1/p' "$out/variant_fusions.txt")
  [[ -n $module ]] && gzip -c "$dump/$module" >"$out/variant_module.txt.gz"
done
rm -rf "$dump"
for m in float32 bfloat16; do
  t0=$SECONDS
  flags=(--parts=train); [[ $m == bfloat16 ]] && flags+=(--moments-dtype=bfloat16)
  python3 scripts/bench/study_perf.py "${flags[@]}" --out="$out/train_$m.json" \
    >"$out/train_$m.log" 2>&1
  echo "train_$m: exit $? after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
done
