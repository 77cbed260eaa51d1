#!/usr/bin/env bash
# The site study (`fp8jax.experiments.study`) with its sweep split over processes and GPUs,
# so that a baseline and a sweep of many evaluation batches fit one device call
# (docs/validation.md, the site study at small scale). Trains the BF16 baseline of CONFIG
# on GPU 0 (RESULTS/train), then runs one `compare` per evaluation offset (the site grid,
# its two noise-matched controls and the noise floor; RESULTS/parts/o<offset>, each
# resumable), spread round-robin over the GPUs, then merges the parts into RESULTS/compare
# and writes its report:
#   bash scripts/gpu/study_parts.sh RESULTS TOKENIZER_JSON
# CONFIG (default experiments/configs/site_study_small.py), OFFSETS (default "0 2 4 6"),
# BATCHES per offset (default 2), BATCH_SIZE (default 16), GPUS (default: all that
# nvidia-smi lists) and TRAIN_EXTRA (more --config.* flags) from the environment. The
# controls name the config's 9 layers (CONTROLS to change them).
set -uo pipefail
out=${1:?usage: study_parts.sh RESULTS TOKENIZER_JSON}
tok=${2:?usage: study_parts.sh RESULTS TOKENIZER_JSON}
config=${CONFIG:-experiments/configs/site_study_small.py}
read -r -a offsets <<<"${OFFSETS:-0 2 4 6}"
read -r -a train_extra <<<"${TRAIN_EXTRA:-}"
gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
((gpus > 0)) || gpus=1
controls=${CONTROLS:-noise(attn_l0-8_e4m3),noise(moe_l0-8_e4m3)}
mkdir -p "$out/logs" "$out/parts"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$out/jax_cache}
CUDA_VISIBLE_DEVICES=0 python3 scripts/run.py fp8jax.experiments.train --config="$config" \
  --config.data.tokenizer="$tok" "${train_extra[@]}" --workdir="$out/train" \
  >"$out/logs/train.log" 2>&1 \
  || { echo "training failed: $out/logs/train.log"; tail -n 5 "$out/logs/train.log"; exit 1; }
parts=()
for i in "${!offsets[@]}"; do
  o=${offsets[$i]}
  parts+=("$out/parts/o$o")
  CUDA_VISIBLE_DEVICES=$((i % gpus)) python3 scripts/run.py fp8jax.experiments.compare \
    --train_workdir="$out/train" --out="$out/parts/o$o" --policies="seed,$controls" \
    --offsets="$o" --batches="${BATCHES:-2}" --batch_size="${BATCH_SIZE:-16}" \
    --scan_layers=True >"$out/logs/compare_o$o.log" 2>&1 &
done
wait
(IFS=,; python3 scripts/run.py fp8jax.experiments.report --results="${parts[*]}" \
  --out="$out/compare" >"$out/logs/report.log" 2>&1)
tail -n 2 "$out"/logs/*.log
