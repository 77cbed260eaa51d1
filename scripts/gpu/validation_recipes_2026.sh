#!/usr/bin/env bash
# The 2026 recipes in the validation matrix (docs/validation.md) on one GPU, beside the
# BF16 and nvfp4_recipe runs of docs/perf_raw/2026-11-28_h200_nvfp4_recipe_te.tar.gz (the
# same config, tokenizer and kind of card), which are unpacked into RESULTS first and not
# trained again. One process per recipe, each training its 10 seeds as one vmapped group;
# the binaries run from the installed wheel (PYTHONPATH), not from the checkout.
#   bash scripts/gpu/validation_recipes_2026.sh RESULTS DEADLINE_S [RECIPES...]
# RECIPES (default: the 4/6 and OAS set) as --recipes takes them. Resumable: finished runs
# are skipped (each process lists bf16 too, whose runs are done). Prints the matrix's summary (with the contrasts) when every run is done.
set -uo pipefail
out=${1:?usage: validation_recipes_2026.sh RESULTS DEADLINE_S [RECIPES...]}
deadline=${2:?DEADLINE_S}
shift 2
recipes=("$@")
((${#recipes[@]})) || recipes=(gemm:nvfp4_4over6 gemm:mxfp4_oas gemm:mxfp4 gemm:nvfp4)
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
all=bf16,gemm:nvfp4_recipe,gemm:nvfp4_4over6,gemm:nvfp4,gemm:mxfp4,gemm:mxfp4_oas
contrasts=(--contrast="gemm:nvfp4_4over6 vs gemm:nvfp4_recipe"
           --contrast="gemm:mxfp4_oas vs gemm:mxfp4" --contrast="gemm:mxfp4_oas vs gemm:nvfp4")
if [ -d "$out/runs/gemm_mxfp8_s0" ]; then
  all+=,gemm:mxfp8,gemm:mxfp8_oas,gemm:mxfp8_2d
  contrasts+=(--contrast="gemm:mxfp8_oas vs gemm:mxfp8" --contrast="gemm:mxfp8_2d vs gemm:mxfp8")
fi
# --deadline_s=0.001: no run starts; the summary of what has finished
"${validate[@]}" --recipes="$all" --deadline_s=0.001 "${contrasts[@]}" \
  >"$out/logs/${call}_summary.log" 2>&1
tail -n 40 "$out/logs/${call}_summary.log"
