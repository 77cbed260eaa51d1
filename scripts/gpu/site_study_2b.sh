#!/usr/bin/env bash
# The site study at 2B on a GPU machine (docs/study_2b.md: The site study at 2B in device
# calls): an 8192-id BPE on generated text, the BF16 baseline of deepseek_moe_2b
# (train_2b_c4.py's recipe on synthetic:TEXT_MB, params-only checkpoints but the newest),
# branch-off runs from the BRANCH_FROM checkpoints (each while it is the newest, so it
# still holds its optimizer state), the site grid with the noise floor and the
# noise-matched controls on every checkpoint, and the report. Resumable: run it again,
# one call after another, until it prints "all stages done".
#   bash scripts/gpu/site_study_2b.sh RESULTS [DEADLINE_S]
# RESULTS: what comes back (< 64 MiB): train/ (metrics.jsonl, config.json, every
# checkpoint's meta, verify.txt), compare/ (rows, report, figures, details.jsonl.gz),
# branch/, tok/, logs/ (each call's card, date and stage times; the binaries' logs) and
# done/ (the finished stages). WORK (default /tmp/ds2b; /tmp/ds_tiny with SIZE=tiny) holds
# the checkpoints and the stages' own folders; it must survive between calls (a warm
# machine keeps /tmp). No stage or unit starts unless its estimate fits before DEADLINE_S
# (default 540) seconds; one that overruns is stopped with SIGTERM at the deadline (the
# binaries resume from what they wrote).
# SIZE=tiny: the same stages at tiny size on CPU (train_tiny.py's model, STEPS=8). More
# from the environment: STEPS, SAVE_EVERY, BRANCH_FROM (steps; BRANCH_FROM= : none),
# BRANCH_AFTER (steps whose checkpoints keep their optimizer state, branched after the
# compare and the report, which then runs again: no training restart per branch point,
# but a full checkpoint on disk each), K, TEXT_MB, WARMUP, POLICIES (compare),
# BRANCH_POLICIES, OFFSETS, BATCHES, BATCH_SIZE, EXTRA (more --config.* flags), PY
# (default python3).
set -uo pipefail
results=${1:?usage: site_study_2b.sh RESULTS [DEADLINE_S]}
deadline=${2:-540}
t0=$SECONDS
size=${SIZE:-2b}
py=${PY:-python3}
mkdir -p "$results"
results=$(cd "$results" && pwd)
if [ "$size" = tiny ]; then
  work=${WORK:-/tmp/ds_tiny}
  config=experiments/configs/train_tiny.py
  steps=${STEPS:-8} save_every=${SAVE_EVERY:-2} branch_from=${BRANCH_FROM-4,8} k=${K:-2}
  text_mb=${TEXT_MB:-1} vocab=320 warmup=${WARMUP:-2}
  size_flags=(--config.data.seq_len=32 --config.data.global_batch=4)
  policies=${POLICIES:-sites,noise(attn_l0-3_e4m3),noise(moe_l0-3_e4m3)}
  offsets=${OFFSETS:-0,3} batches=${BATCHES:-2} batch_size=${BATCH_SIZE:-2}
  compare_flags=()
  # Seconds: a binary's start (import, compile, restore), a training step, a compare
  # checkpoint, a branch checkpoint (first estimates; measured ones replace them).
  est_start=${EST_START:-40} est_step=${EST_STEP:-1} est_ckpt=${EST_CKPT:-20} est_branch=${EST_BRANCH:-60}
else
  work=${WORK:-/tmp/ds2b}
  config=experiments/configs/train_2b_c4.py
  steps=${STEPS:-2000} save_every=${SAVE_EVERY:-200} branch_from=${BRANCH_FROM-400,800,1200,1600,2000}
  # 2000 x 16 x 2048 = 65.5M tokens; the 8192-id BPE gives 5.2 bytes per token on this
  # text, so 400 MB is read once (64 MB would repeat about 4 epochs). The first start
  # generates and tokenizes it (minutes), later ones read FP8JAX_DATA_CACHE.
  k=${K:-50} text_mb=${TEXT_MB:-400} vocab=8192 warmup=${WARMUP:-200}
  size_flags=(--config.train.checkpoint_params_dtype=bfloat16)
  policies=${POLICIES:-sites,noise(attn_l0-8_e4m3),noise(moe_l0-8_e4m3)}
  offsets=${OFFSETS:-0,1000} batches=${BATCHES:-4} batch_size=${BATCH_SIZE:-16}
  compare_flags=(--moe_impl=pallas --scan_layers)
  est_start=${EST_START:-120} est_step=${EST_STEP:-0.2} est_ckpt=${EST_CKPT:-90} est_branch=${EST_BRANCH:-300}
fi
branch_policies=${BRANCH_POLICIES:-sites}
# The branch binary's share of each GPU's memory: at 2B, 95% holds two branches beside the
# reference where XLA's default 75% holds one (docs/performance/archive/2026-11-29_branch_groups.md).
branch_env=(env "XLA_PYTHON_CLIENT_MEM_FRACTION=${BRANCH_MEM_FRACTION:-0.95}")
branch_after=${BRANCH_AFTER:-}
opt_item=optimizer  # fp8jax.train.full_state.ITEM
keep_full=()
[ -n "$branch_after" ] && keep_full=(--config.train.full_state_steps="($branch_after,)")
read -r -a extra <<<"${EXTRA:-}"
mkdir -p "$work/done" "$work/logs"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export FP8JAX_COMPILE_CACHE=${FP8JAX_COMPILE_CACHE:-$work/jax_cache}
# The generated text, tokenized and packed once, read back by every later start.
export FP8JAX_DATA_CACHE=${FP8JAX_DATA_CACHE:-$work/data_cache}
call=$(date -u +%Y%m%dT%H%M%S)
calls=$work/logs/calls.txt
{ echo "call $call: SIZE=$size deadline ${deadline}s"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "no GPU (nvidia-smi)"
  date -u; } >>"$calls"
if [ -f "$results/done/all" ] && [ ! -d "$work/train/checkpoints" ]; then
  echo "all stages done (RESULTS says so)"; exit 0
fi
if [ -d "$results/done" ] && [ -n "$(ls "$results/done")" ] && [ ! -d "$work/train/checkpoints" ]; then
  echo "warning: RESULTS has finished stages but WORK $work has no checkpoints (a fresh" \
    "machine?): the study starts over in WORK" | tee -a "$calls"
fi

left() { echo $((deadline - (SECONDS - t0))); }
fits() {  # fits SECONDS: whether a unit estimated at SECONDS ends before the deadline
  awk -v e="$1" -v l="$(left)" 'BEGIN { exit !(e <= l) }'
}
measured() {  # measured NAME DEFAULT: the last measured seconds of NAME, else DEFAULT
  if [ -f "$work/est_$1" ]; then cat "$work/est_$1"; else echo "$2"; fi
}
run_unit() {  # run_unit LOG CMD...: CMD under the deadline (SIGTERM, then SIGKILL); its rc
  local log=$1; shift
  local s=$SECONDS rc
  echo "[$(date -u +%T)] $*" >>"$work/logs/$log.log"
  timeout -k 20 -s TERM "$(left)" "$@" >>"$work/logs/$log.log" 2>&1
  rc=$?
  echo "$log $((SECONDS - s)) s rc $rc" | tee -a "$calls"
  return $rc
}
latest_step() {
  ls "$work/train/checkpoints" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1
}
units() {  # units NAME EST FLAG CMD...: the steps in todo, as many per run of CMD as fit
  # (EST: seconds per step beyond a binary's start, until measured), each run given
  # FLAG=<its steps>; done/NAME_<step> after each run
  local name=$1 est=$2 flag=$3 per n s rc
  shift 3
  while ((${#todo[@]})); do
    per=$(measured "${name}_step" "$est")
    n=$(awk -v l="$(left)" -v b="$est_start" -v p="$per" 'BEGIN { print int((l - b) / p) }')
    ((n > 0)) || { echo "no time for $name of ${todo[*]}"; exit 0; }
    unit=("${todo[@]:0:n}")
    s=$SECONDS
    run_unit "$name" "$@" "$flag=$(IFS=,; echo "${unit[*]}")" || {
      rc=$?; echo "$name stopped: $work/logs/$name.log (rc $rc)"
      ((rc == 124 || rc == 137)) && exit 0; exit 1; }
    awk -v d="$((SECONDS - s))" -v b="$est_start" -v n="${#unit[@]}" \
      'BEGIN { v = (d - b) / n; print (v > 1 ? v : 1) }' >"$work/est_${name}_step"
    for s in "${unit[@]}"; do touch "$work/done/${name}_$s"; done
    todo=("${todo[@]:n}")
  done
}
sync_results() {  # the small files that come back, from WORK to RESULTS
  mkdir -p "$results/train/checkpoints" "$results/logs" "$results/done"
  cp -f "$work"/logs/* "$results/logs/" 2>/dev/null
  cp -f "$work"/done/* "$results/done/" 2>/dev/null
  [ -d "$work/tok" ] && mkdir -p "$results/tok" && cp -f "$work"/tok/*.json "$results/tok/" 2>/dev/null
  for f in metrics.jsonl config.json run.json verify.txt; do
    [ -f "$work/train/$f" ] && cp -f "$work/train/$f" "$results/train/"
  done
  for d in "$work"/train/checkpoints/*; do
    [ -d "$d/meta" ] || continue
    local s; s=$(basename "$d")
    mkdir -p "$results/train/checkpoints/$s"
    cp -f "$d/meta/metadata" "$results/train/checkpoints/$s/meta.json"
    cp -f "$d/data/metadata" "$results/train/checkpoints/$s/data.json" 2>/dev/null
    if [ -d "$d/optimizer" ]; then echo full; else echo params_only; fi \
      >"$results/train/checkpoints/$s/kind.txt"
  done
  if [ -d "$work/compare" ]; then
    mkdir -p "$results/compare"
    (cd "$work/compare" && find . -type f ! -name details.jsonl ! -name .lock \
      -exec cp -f --parents {} "$results/compare/" \;)
    [ -f "$work/compare/details.jsonl" ] && gzip -c "$work/compare/details.jsonl" \
      >"$results/compare/details.jsonl.gz"
  fi
  [ -d "$work/branch" ] && mkdir -p "$results/branch" && \
    (cd "$work/branch" && find . -type f ! -name .lock -exec cp -f --parents {} "$results/branch/" \;)
  local mb; mb=$(du -sm "$results" | cut -f1)
  if ((mb > 60)); then  # the per-parameter details are the only large file
    rm -f "$results/compare/details.jsonl.gz"
    echo "details.jsonl.gz left out: RESULTS was ${mb} MB" | tee -a "$results/logs/calls.txt"
  fi
}
trap 'echo "call $call ended after $((SECONDS - t0)) s" >>"$calls"; sync_results' EXIT

# 1. The tokenizer.
if [ ! -f "$work/tok/tokenizer.json" ]; then
  fits "$est_start" || { echo "no time for the tokenizer"; exit 0; }
  run_unit tokenizer "$py" scripts/run.py fp8jax.experiments.train_tokenizer \
    --input="synthetic:$text_mb" --out="$work/tok" --vocab_size="$vocab" \
    --sample_mb="$((text_mb < 64 ? text_mb : 64))" \
    || { echo "tokenizer failed: $work/logs/tokenizer.log"; exit 1; }
fi

# 2. The baseline to each branch step in turn, and the branches from it.
train_to() {  # train_to STEP: trains (or resumes) to STEP; its rc
  local resume=()
  [ -n "$(latest_step)" ] && resume=(--resume)
  run_unit train "$py" scripts/run.py fp8jax.experiments.train --config="$config" \
    --workdir="$work/train" "${resume[@]}" --config.data.source="synthetic:$text_mb" \
    --config.data.tokenizer="$work/tok/tokenizer.json" --config.train.steps="$1" \
    --config.optim.total_steps="$steps" --config.optim.warmup_steps="$warmup" \
    --config.train.save_every="$save_every" --config.train.full_state=last \
    "${keep_full[@]}" "${size_flags[@]}" "${extra[@]}"
}
IFS=, read -r -a branch_steps <<<"$branch_from"
targets=$(printf '%s\n' "${branch_steps[@]}" "$steps" | sort -n -u)
for target in $targets; do
  if [ ! -f "$work/done/train_$target" ]; then
    while [ "${latest:=$(latest_step)}" != "$target" ] || [ -z "$latest" ]; do
      from=${latest:-0}
      step_s=$(measured step "$est_step")
      # As far as fits: the target, else the furthest checkpoint before it that does.
      to=$(awk -v f="$from" -v t="$target" -v e="$save_every" -v s="$step_s" \
        -v b="$est_start" -v l="$(left)" 'BEGIN { n = int((l - b) / s); to = f + n;
          if (to >= t) to = t; else to = int(to / e) * e; print (to > f ? to : "") }')
      [ -n "$to" ] || { echo "no time to train to step $target (at $from)"; exit 0; }
      s=$SECONDS
      train_to "$to"
      rc=$?
      case $rc in
        0) ;;
        75 | 124 | 137) echo "training stopped at the deadline (rc $rc)"; exit 0 ;;
        *) echo "training failed (rc $rc): $work/logs/train.log"; exit 1 ;;
      esac
      awk -v d="$((SECONDS - s))" -v b="$est_start" -v n="$((to - from))" \
        'BEGIN { v = (d - b) / n; print (v > 0.01 ? v : 0.01) }' >"$work/est_step"
      latest=$(latest_step)
    done
    touch "$work/done/train_$target"
  fi
  unset latest
  if [[ ",$branch_from," == *",$target,"* ]] && [ ! -f "$work/done/branch_$target" ]; then
    [ "$(latest_step)" = "$target" ] || { echo "error: branch from $target: the newest checkpoint is $(latest_step)"; exit 1; }
    fits "$(measured branch "$est_branch")" || { echo "no time for the branches from $target"; exit 0; }
    s=$SECONDS
    run_unit branch "${branch_env[@]}" "$py" scripts/run.py fp8jax.experiments.branch --train_workdir="$work/train" \
      --out="$work/branch" --policies="$branch_policies" --k="$k" --from_steps="$target" \
      || { rc=$?; echo "branch from $target stopped: $work/logs/branch.log (rc $rc)"; ((rc == 124 || rc == 137)) && exit 0; exit 1; }
    echo $((SECONDS - s)) >"$work/est_branch"
    touch "$work/done/branch_$target"
  fi
done

# 3. Every checkpoint verified (params-only ones too), then compared, as many per call as fit.
if [ ! -f "$work/done/verify" ]; then
  fits "$est_start" || { echo "no time to verify"; exit 0; }
  run_unit verify "$py" scripts/run.py fp8jax.experiments.verify --workdir="$work/train" \
    && cp "$work/logs/verify.log" "$work/train/verify.txt" && touch "$work/done/verify"
fi
ckpts=$(ls "$work/train/checkpoints" | grep -E '^[0-9]+$' | sort -n)
todo=()
for s in $ckpts; do [ -f "$work/done/compare_$s" ] || todo+=("$s"); done
units compare "$est_ckpt" --steps "$py" scripts/run.py fp8jax.experiments.compare \
  --train_workdir="$work/train" --out="$work/compare" --policies="$policies" \
  --offsets="$offsets" --batches="$batches" --batch_size="$batch_size" "${compare_flags[@]}"

# 4. The report, with the branches so far.
report() {  # report MARKER: the report of the compare (and the branches), then MARKER
  fits "$est_start" || { echo "no time for the report"; exit 0; }
  local branch_flag=()
  [ -d "$work/branch" ] && branch_flag=(--branch="$work/branch")  # no branches: none
  run_unit report "$py" scripts/run.py fp8jax.experiments.report --results="$work/compare" \
    "${branch_flag[@]}" || { echo "report failed: $work/logs/report.log"; exit 1; }
  touch "$work/done/$1"
}
[ -f "$work/done/report" ] || report report

# 5. The BRANCH_AFTER branches, as many checkpoints per call as fit, then the report again.
if [ -n "$branch_after" ]; then
  IFS=, read -r -a late <<<"$branch_after"
  todo=()
  for s in "${late[@]}"; do [ -f "$work/done/branch_$s" ] || todo+=("$s"); done
  for s in "${todo[@]}"; do
    [ -d "$work/train/checkpoints/$s/$opt_item" ] || {
      echo "error: BRANCH_AFTER step $s: its checkpoint holds no optimizer state"; exit 1; }
  done
  ((${#todo[@]})) && rm -f "$work/done/report_branches"
  units branch "$est_branch" --from_steps "${branch_env[@]}" "$py" scripts/run.py fp8jax.experiments.branch \
    --train_workdir="$work/train" --out="$work/branch" --policies="$branch_policies" --k="$k"
  [ -f "$work/done/report_branches" ] || report report_branches
fi
touch "$work/done/all"
echo "all stages done in $work; results in $results"
