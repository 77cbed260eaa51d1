#!/usr/bin/env bash
# The train binary's step on one GPU from two installed wheels (a change's before and
# after), then the registry's Llama through the same binary: each run's metrics.jsonl and
# log under OUT, and a line per run with its median tokens/s over the logged steps.
#   bash scripts/gpu/train_before_after.sh OLD_SITE NEW_SITE OUT
# OLD_SITE, NEW_SITE: pip --target folders of the two wheels (each with ml-collections).
set -uo pipefail
old=${1:?OLD_SITE} new=${2:?NEW_SITE} out=${3:?OUT}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
cd /tmp || exit 1  # the installed packages, not the checkout's folders
common=(--config.data.source=synthetic:16 --config.data.tokenizer=bytes
        --config.train.checkpoints=False --config.train.log_every=10)
run() {  # NAME SITE CONFIG FLAGS...
  local name=$1 site=$2 config=$3
  shift 3
  rm -rf "/tmp/tb_$name"
  PYTHONPATH=$site python3 -m fp8jax.experiments.train --config="$repo/$config" \
    --workdir="/tmp/tb_$name" "${common[@]}" "$@" >"$out/$name.log" 2>&1
  echo "$name: exit $?" | tee -a "$out/summary.txt"
  cp "/tmp/tb_$name/metrics.jsonl" "$out/$name.metrics.jsonl" 2>/dev/null
  python3 - "$out/$name.metrics.jsonl" "$name" <<'PY' | tee -a "$out/summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]  # the first window holds the compile
tps = [r["tokens_per_s"] for r in rows]
print(f"{sys.argv[2]}: median {statistics.median(tps):.0f} tokens/s over {len(tps)} windows, "
      f"mfu {statistics.median(r['mfu'] or 0 for r in rows):.4f}, last loss {rows[-1]['loss']:.4f}")
PY
}
ds=(--config.train.steps=60 --config.optim.warmup_steps=10)
run ds2b_old "$old" experiments/configs/train_2b_c4.py "${ds[@]}"
run ds2b_new "$new" experiments/configs/train_2b_c4.py "${ds[@]}"
run ds2b_old2 "$old" experiments/configs/train_2b_c4.py "${ds[@]}"
ll=(--config.model=llama:small --config.data.seq_len=1024 --config.data.global_batch=32
    --config.train.steps=60 --config.optim.warmup_steps=10)
run llama_bf16 "$new" experiments/configs/train_llama_tiny.py "${ll[@]}"
run llama_fp8 "$new" experiments/configs/train_llama_tiny.py "${ll[@]}" \
  --config.policy=gemm:fp32_blockwise
nvidia-smi --query-gpu=name --format=csv,noheader >>"$out/summary.txt"
