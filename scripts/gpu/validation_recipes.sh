#!/usr/bin/env bash
# A set of this year's recipes in the validation matrix (docs/validation.md) on one GPU, 10
# seeds each, beside the BF16 and nvfp4_recipe runs of
# docs/perf_raw/2026-11-28_h200_nvfp4_recipe_te.tar.gz (the same config, tokenizer and kind
# of card), which are unpacked into RESULTS first and not trained again. One process per
# recipe, each training its 10 seeds as one vmapped group; the binaries run from the
# installed wheel (PYTHONPATH), not from the checkout.
#   bash scripts/gpu/validation_recipes.sh RESULTS DEADLINE_S SET [RECIPES...]
# SET: 2026 (Four Over Six, OAS, 2-D MXFP8 and their references), quartet2_ufp4 (Quartet
# II with its SR baseline, UFP4 on three grids), te2026 (Transformer Engine's row-scaled
# NVFP4 and UE5M3 block scales, each the NVFP4 recipe with that one change) or te_custom
# (TE's CustomRecipe example: MXFP8 forward, NVFP4 backward). RECIPES (default: the
# set's) as --recipes takes them. Resumable: finished runs are skipped. Prints the set's summary, with its
# contrasts, when every run is done.
set -uo pipefail
out=${1:?usage: validation_recipes.sh RESULTS DEADLINE_S SET [RECIPES...]}
deadline=${2:?DEADLINE_S}
set_name=${3:?SET: 2026, quartet2_ufp4, te2026 or te_custom}
shift 3
case $set_name in
  2026)
    default=(gemm:nvfp4_4over6 gemm:mxfp4_oas gemm:mxfp4 gemm:nvfp4)
    all=bf16,gemm:nvfp4_recipe,gemm:nvfp4_4over6,gemm:nvfp4,gemm:mxfp4,gemm:mxfp4_oas
    contrasts=(--contrast="gemm:nvfp4_4over6 vs gemm:nvfp4_recipe"
               --contrast="gemm:mxfp4_oas vs gemm:mxfp4" --contrast="gemm:mxfp4_oas vs gemm:nvfp4")
    if [ -d "$out/runs/gemm_mxfp8_s0" ]; then
      all+=,gemm:mxfp8,gemm:mxfp8_oas,gemm:mxfp8_2d
      contrasts+=(--contrast="gemm:mxfp8_oas vs gemm:mxfp8"
                  --contrast="gemm:mxfp8_2d vs gemm:mxfp8")
    fi ;;
  quartet2_ufp4)
    default=(gemm:nvfp4_quartet2 gemm:nvfp4_quartet2_sr gemm:ufp4 gemm:ufp4_int4 gemm:ufp4_e2m1)
    all=bf16,gemm:nvfp4_recipe,gemm:nvfp4_quartet2,gemm:nvfp4_quartet2_sr,gemm:ufp4
    all+=,gemm:ufp4_int4,gemm:ufp4_e2m1
    contrasts=(--contrast="gemm:nvfp4_quartet2 vs gemm:nvfp4_quartet2_sr"
               --contrast="gemm:nvfp4_quartet2 vs gemm:nvfp4_recipe"
               --contrast="gemm:ufp4 vs gemm:ufp4_e2m1" --contrast="gemm:ufp4_int4 vs gemm:ufp4"
               --contrast="gemm:ufp4 vs gemm:nvfp4_recipe"
               --contrast="gemm:ufp4_e2m1 vs gemm:nvfp4_recipe") ;;
  te2026)
    default=(gemm:nvfp4_row_scaled gemm:nvfp4_ue5m3)
    all=bf16,gemm:nvfp4_recipe,gemm:nvfp4_row_scaled,gemm:nvfp4_ue5m3
    contrasts=(--contrast="gemm:nvfp4_row_scaled vs gemm:nvfp4_recipe"
               --contrast="gemm:nvfp4_ue5m3 vs gemm:nvfp4_recipe") ;;
  te_custom)
    default=(gemm:mxfp8_fwd_nvfp4_bwd)
    all=bf16,gemm:nvfp4_recipe,gemm:mxfp8_fwd_nvfp4_bwd
    contrasts=(--contrast="gemm:mxfp8_fwd_nvfp4_bwd vs gemm:nvfp4_recipe") ;;
  *) echo "unknown SET $set_name: 2026, quartet2_ufp4, te2026 or te_custom" >&2; exit 2 ;;
esac
recipes=("$@")
((${#recipes[@]})) || recipes=("${default[@]}")
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
# --deadline_s=0.001: no run starts; the summary of what has finished
"${validate[@]}" --recipes="$all" --deadline_s=0.001 "${contrasts[@]}" \
  >"$out/logs/${call}_summary.log" 2>&1
tail -n 40 "$out/logs/${call}_summary.log"
