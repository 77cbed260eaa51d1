#!/usr/bin/env bash
# The GEMM recipe's pair (study_perf.py --parts=paired) and the grouped blockwise checks,
# in another source tree (BEFORE, e.g. `git archive <commit> fp8jax models scripts`) and in
# this one, one process each, alternating, sharing one compilation cache (the BF16 pass is
# the same program in both). Writes RESULTS/<name>.json, logs and summary.txt.
#   bash scripts/gpu/before_after_pair.sh RESULTS BEFORE [POLICY]
set -uo pipefail
out=${1:?usage: before_after_pair.sh RESULTS BEFORE [POLICY]}
before=$(cd "${2:?usage: before_after_pair.sh RESULTS BEFORE [POLICY]}" && pwd)
policy=${3:-gemm:fp32_blockwise}
here=$(pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache_ba}
step() {  # step NAME TREE COMMAND...
  local name=$1 tree=$2 t0=$SECONDS
  shift 2
  (cd "$tree" && mkdir -p "$out/$name" && OUT="$out/$name" "$@") >"$out/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
}
for tree in before after; do
  dir=$here; [[ $tree == before ]] && dir=$before
  step "paired_$tree" "$dir" python3 scripts/bench/study_perf.py --parts=paired \
    --paired-policies="$policy" --out="$out/paired_$tree.json"
done
step wgrad_layouts "$here" python3 scripts/gpu/check_wgrad_layouts.py
for tree in before after; do
  dir=$here; [[ $tree == before ]] && dir=$before
  step "check_$tree" "$dir" python3 scripts/gpu/check_grouped_blockwise.py
done
