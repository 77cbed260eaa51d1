#!/usr/bin/env bash
# The validation matrix on a GPU machine (docs/validation.md): PROCS copies of the validate
# binary share one matrix (each takes the runs no other holds), so compilation (CPU) and
# small steps (GPU) overlap; the copies are spread round-robin over the GPUs (GPUS, default:
# all that nvidia-smi lists). Resumable: run it again with the same RESULTS folder, carried
# back.
#   bash scripts/gpu/validation.sh RESULTS [DEADLINE_S]
# RESULTS: the matrix folder (runs/<recipe>_s<seed>/metrics.jsonl, summary.md/json) and
# the tokenizer (tok1k/, trained here on the first call). No run starts after DEADLINE_S
# (default 360) seconds; a started one runs to its end (the config saves no checkpoints).
# RECIPES, SEEDS, PROCS (default 6), EXTRA (more --config.* flags) from the environment;
# GROUP=1: each process trains a recipe's seeds together, vmapped (validate --group_seeds:
# one compilation per recipe; then PROCS of 2-4 keep the GPU busy).
set -uo pipefail
out=${1:?usage: validation.sh RESULTS [DEADLINE_S]}
deadline=${2:-360}
procs=${PROCS:-6}
gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
((gpus > 0)) || gpus=1
recipes=${RECIPES:-bf16,gemm:fp32_blockwise,gemm:mxfp8,gemm:mxfp8_ocp,gemm:mxfp4,gemm:nvfp4,gemm:nvfp4_recipe,gemm:nvfp4_recipe_no_rht,gemm:nvfp4_recipe_no_2d,gemm:nvfp4_recipe_no_sr,gemm:nvfp4_recipe_no_tail}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if [ ! -f "$out/tok1k/tokenizer.json" ]; then
  python3 scripts/run.py fp8jax.experiments.train_tokenizer --input=synthetic:8 \
    --out="$out/tok1k" --vocab_size=1024 --sample_mb=8 || exit 1
fi
t0=$SECONDS
call=$(date -u +%Y%m%dT%H%M%S)
read -r -a extra <<<"${EXTRA:-}"
[ "${GROUP:-0}" = 1 ] && extra+=(--group_seeds)
for i in $(seq "$procs"); do
  CUDA_VISIBLE_DEVICES=$(((i - 1) % gpus)) python3 scripts/run.py fp8jax.experiments.validate \
    --config=experiments/configs/validate_small.py \
    --config.data.tokenizer="$out/tok1k/tokenizer.json" "${extra[@]}" \
    --out="$out" --recipes="$recipes" --seeds="${SEEDS:-0-2}" --deadline_s="$deadline" \
    >"$out/logs/${call}_p$i.log" 2>&1 &
  sleep 3  # each takes the next free run
done
wait
echo "call $call: $procs processes on $gpus GPUs, $((SECONDS - t0)) s" | tee -a "$out/logs/calls.txt"
nvidia-smi --query-gpu=name --format=csv,noheader >>"$out/logs/calls.txt"
find "$out" -name .lock -delete
tail -n 30 "$out/summary.md"
