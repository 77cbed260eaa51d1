#!/usr/bin/env bash
# Quartet II and UFP4 in the validation matrix (docs/validation.md) on one GPU, 10 seeds
# each, beside the BF16 and nvfp4_recipe runs of docs/perf_raw/2026-11-28_h200_nvfp4_recipe_te.tar.gz
# (the same config, tokenizer and kind of card), which are unpacked into RESULTS first and
# not trained again; nvfp4_quartet2_sr (stochastic rounding of the elements in place of
# MS-EDEN, the same pipeline otherwise) is the SR baseline MS-EDEN is compared with, and
# ufp4_e2m1 the E2M1 contrast of UFP4's grid. One process per recipe, each training its 10
# seeds as one vmapped group; the binaries run from the installed wheel (PYTHONPATH), not
# from the checkout. Modelled on validation_recipes_2026.sh.
#   bash scripts/gpu/validation_recipes_2026b.sh RESULTS DEADLINE_S [RECIPES...]
# RECIPES (default: the Quartet II and UFP4 set) as --recipes takes them. Resumable:
# finished runs are skipped. Prints the matrix's summary (with the contrasts) when every
# run is done.
set -uo pipefail
out=${1:?usage: validation_recipes_2026b.sh RESULTS DEADLINE_S [RECIPES...]}
deadline=${2:?DEADLINE_S}
shift 2
recipes=("$@")
((${#recipes[@]})) || recipes=(gemm:nvfp4_quartet2 gemm:nvfp4_quartet2_sr gemm:ufp4
                               gemm:ufp4_int4 gemm:ufp4_e2m1)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
prior=$repo/docs/perf_raw/2026-11-28_h200_nvfp4_recipe_te.tar.gz
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p "$out/logs" "$out/runs"
if [ ! -f "$out/tok1k/tokenizer.json" ]; then
  tmp=$(mktemp -d)
  tar xzf "$prior" -C "$tmp" || exit 1
  cp -r "$tmp"/*/tok1k "$out/" && cp -r "$tmp"/*/runs/bf16_s* "$tmp"/*/runs/gemm_nvfp4_recipe_s* \
    "$out/runs/" || exit 1
  rm -rf "$tmp"
fi
cd /tmp || exit 1  # the installed package, not the checkout's folders
validate=(python3 -m fp8jax.experiments.validate
          --config="$repo/experiments/configs/validate_small.py"
          --config.data.tokenizer="$out/tok1k/tokenizer.json" --out="$out" --seeds=0-9)
call=$(date -u +%Y%m%dT%H%M%S)
t0=$SECONDS
for r in "${recipes[@]}"; do
  "${validate[@]}" --recipes="bf16,$r" --group_seeds --deadline_s="$deadline" \
    >"$out/logs/${call}_${r//:/_}.log" 2>&1 &
  sleep 2
done
wait
echo "call $call: ${#recipes[@]} processes, $((SECONDS - t0)) s" | tee -a "$out/logs/calls.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >>"$out/logs/calls.txt"
find "$out" -name .lock -delete
all=bf16,gemm:nvfp4_recipe,gemm:nvfp4_quartet2,gemm:nvfp4_quartet2_sr,gemm:ufp4,gemm:ufp4_int4,gemm:ufp4_e2m1
contrasts=(--contrast="gemm:nvfp4_quartet2 vs gemm:nvfp4_quartet2_sr"
           --contrast="gemm:nvfp4_quartet2 vs gemm:nvfp4_recipe"
           --contrast="gemm:ufp4 vs gemm:ufp4_e2m1" --contrast="gemm:ufp4 vs gemm:nvfp4_recipe"
           --contrast="gemm:ufp4_int4 vs gemm:ufp4")
# --deadline_s=0.001: no run starts; the summary of what has finished
"${validate[@]}" --recipes="$all" --deadline_s=0.001 "${contrasts[@]}" \
  >"$out/logs/${call}_summary.log" 2>&1
tail -n 40 "$out/logs/${call}_summary.log"
