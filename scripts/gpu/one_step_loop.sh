#!/usr/bin/env bash
# The one-step comparison on checkpoints of the validation matrix's BF16 runs
# (docs/validation.md, "Does the one-step ranking predict the full runs?"). In parallel, a
# BF16 run of the matrix's config per seed with checkpoints at 0, 400 and 800
# (RESULTS/train_s<seed>); then `compare` of the matrix's recipes on checkpoints STEPS, a
# process per part of the recipes (RESULTS/one_step/s<seed>.p<i>: compare's rows,
# resumable; the first part also has the noise floor): a recipe compiled in 25-91 s on an
# H100 without the scan over layers (on now), so the parts compile in parallel. The first
# seed's parts go first, the other seeds' after them: they find its compilations in the
# persistent cache (JAX_COMPILATION_CACHE_DIR, default RESULTS/jax_cache) and only trace.
# Then
#   python -m fp8jax.experiments.validate ... --one_step=RESULTS/one_step
# sets that ranking against the full runs' gaps (it merges a seed's parts).
#   bash scripts/gpu/one_step_loop.sh RESULTS TOKENIZER_JSON
# SEEDS (default "0 1 2"), STEPS (default 400,800), PARTS (space-separated parts, each a
# comma-separated list of recipes), BATCHES (default 2) and TRAIN_EXTRA (more --config.*
# flags of the BF16 runs) from the environment.
set -uo pipefail
out=${1:?usage: one_step_loop.sh RESULTS TOKENIZER_JSON}
tok=${2:?usage: one_step_loop.sh RESULTS TOKENIZER_JSON}
read -r -a parts <<<"${PARTS:-gemm:nvfp4_recipe gemm:fp32_blockwise,gemm:mxfp8,gemm:mxfp8_ocp gemm:mxfp4,gemm:nvfp4 gemm:nvfp4_recipe_no_rht,gemm:nvfp4_recipe_no_2d gemm:nvfp4_recipe_no_sr,gemm:nvfp4_recipe_no_tail}"
read -r -a seeds <<<"${SEEDS:-0 1 2}"
read -r -a train_extra <<<"${TRAIN_EXTRA:-}"
mkdir -p "$out/logs" "$out/one_step"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$out/jax_cache}
train() {
  python3 scripts/run.py fp8jax.experiments.train \
    --config=experiments/configs/validate_small.py --config.data.tokenizer="$tok" \
    --config.seed="$1" --config.train.checkpoints=True --config.train.save_every=400 \
    "${train_extra[@]}" --workdir="$out/train_s$1" >"$out/logs/train_s$1.log" 2>&1
}
compare() {  # seed, part index
  python3 scripts/run.py fp8jax.experiments.compare --train_workdir="$out/train_s$1" \
    --out="$out/one_step/s$1.p$2" --policies="${parts[$2]}" --floor="$(($2 == 0))" \
    --steps="${STEPS:-400,800}" --offsets=0 --batches="${BATCHES:-2}" --batch_size=16 \
    --telemetry=False --scan_layers=True >"$out/logs/compare_s$1.p$2.log" 2>&1
}
for s in "${seeds[@]}"; do train "$s" & done
wait
for i in "${!parts[@]}"; do compare "${seeds[0]}" "$i" & done
wait
for s in "${seeds[@]:1}"; do for i in "${!parts[@]}"; do compare "$s" "$i" & done; done
wait
tail -n 2 "$out"/logs/*.log
