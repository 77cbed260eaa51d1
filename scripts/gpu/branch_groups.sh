#!/usr/bin/env bash
# Where a 2B branch-off run's time goes on one GPU (scripts/bench/branch_groups.py):
# a 2-step BF16 run of train_2b_c4.py (8 x 2048 tokens, generated text, byte tokens)
# with its full state saved at step 2, then its branches from step 2 (the noise branch
# and two site policies, K steps each) four ways:
#   reread   one branch per group, the checkpoint read from disk again for each group;
#   kept     one branch per group, the restored state kept in host memory;
#   auto     as many together as fit (branch_memory.auto_together);
#   auto95   the same with XLA allowed 95% of the GPU's memory.
# VARIANTS="kept auto95" runs those only.
# Results (JSON rows, logs, the card) in $OUT.   K=8 bash scripts/gpu/branch_groups.sh
set -uo pipefail
out=${OUT:?set OUT}
work=${WORK:-/tmp/branch_groups}
k=${K:-8}
policies=${POLICIES:-attn_l0-8_e4m3,moe_l0-8_e4m3}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export FP8JAX_COMPILE_CACHE=$work/jax_cache FP8JAX_DATA_CACHE=$work/data_cache
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
mkdir -p "$out" "$work"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; free -g | head -2
  df -h /tmp | tail -1; date -u; } >"$out/card.txt" 2>&1
if [ ! -d "$work/train/checkpoints/2" ]; then
  s=$SECONDS
  timeout "${TRAIN_LIMIT:-300}" python3 scripts/run.py fp8jax.experiments.train \
    --config=experiments/configs/train_2b_c4.py --workdir="$work/train" \
    --config.data.source=synthetic:16 --config.data.global_batch=8 \
    --config.train.steps=2 --config.train.save_every=2 --config.train.full_state=last \
    >"$out/train.log" 2>&1
  echo "train rc $? in $((SECONDS - s)) s" | tee -a "$out/card.txt"
fi
du -sh "$work"/train/checkpoints/* >>"$out/card.txt" 2>&1
declare -A flags_of=([reread]="--max_together=1 --no-keep_restored"
  [kept]="--max_together=1" [auto]="" [auto95]="")
for tag in ${VARIANTS:-reread kept auto auto95}; do
  flags=${flags_of[$tag]}
  env=()
  [ "$tag" = auto95 ] && env=(XLA_PYTHON_CLIENT_MEM_FRACTION=0.95)
  s=$SECONDS
  # shellcheck disable=SC2086
  env "${env[@]}" timeout "${LIMIT:-240}" python3 scripts/bench/branch_groups.py \
    --train_workdir="$work/train" --branch_out="$work/branch_$tag" --from_step=2 --k="$k" \
    --policies="$policies" --tag="$tag" $flags --out="$out/branch_$tag.json" \
    >"$out/branch_$tag.log" 2>&1
  echo "$tag rc $? in $((SECONDS - s)) s" | tee -a "$out/card.txt"
  grep -v "ETA\|^I0000\|^W0000" "$out/branch_$tag.log" | tail -n 3
done
