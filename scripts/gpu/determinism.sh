#!/usr/bin/env bash
# GPU evidence for the deterministic mode (docs/determinism.md): the issue's command, a
# 2-layer run at the DeepSeek-MoE-2B widths, 100 steps with checkpoints at 0, 50 and 100:
#   det_a, det_b   --config.train.deterministic=True, twice (det_b compiles anew, in a
#                  compilation cache of its own): equal losses and digests?
#   det_c          the same, stopped after step 60 and resumed to 100: equal to det_a?
#   def_a, def_b   the default mode, twice (no checkpoints): the run-to-run spread.
# JAX's persistent compilation cache is on: det_c and def_b reuse det_a's and def_a's
# executables, so the spread of the default runs is that of execution alone, not of
# autotuning; det_b's own compilation also tests autotuning. Run from the repository root on the GPU image:
#   bash scripts/gpu/determinism.sh OUT_DIR [WORK_DIR]
# DET_ARGS (environment): the flags that make a run deterministic (default
# --config.train.deterministic=True); DEFAULT=0 skips the default-mode runs, DEFAULT=1
# runs def_a only.
set -uo pipefail
out=${1:?usage: determinism.sh OUT_DIR [WORK_DIR]}
work=${2:-/tmp/det}
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=$work/cache \
  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
common=(--config=experiments/configs/train_2b8l_full.py
        --config.model_overrides.num_hidden_layers=2 --config.train.steps=100
        --config.optim.warmup_steps=20 --config.optim.total_steps=100 --config.train.save_every=50
        --config.train.checkpoints=True --config.train.log_every=1)
train() {  # NAME ARGS...: a run in $work/NAME, its log and metrics in $out
  local name=$1; shift
  local t0=$SECONDS
  python3 scripts/run.py fp8jax.experiments.train "${common[@]}" --workdir="$work/$name" "$@" \
    >>"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  cp "$work/$name/metrics.jsonl" "$out/${name}_metrics.jsonl" 2>/dev/null
  return 0
}
drop_states() { rm -rf "$work/$1"/checkpoints/*/state; }  # digests stay in meta

read -r -a det_args <<<"${DET_ARGS:---config.train.deterministic=True}"
train det_a "${det_args[@]}"
JAX_COMPILATION_CACHE_DIR=$work/cache_b train det_b "${det_args[@]}"
python3 scripts/gpu/same_bits.py "$work/det_a" "$work/det_b" --json="$out/same_det.json" \
  | tail -3 | tee -a "$out/summary.txt"
drop_states det_b

# det_c: the first 60 steps, then --resume to 100 (optim.total_steps fixes the schedule).
train det_c "${det_args[@]}" --config.train.steps=60
train det_c "${det_args[@]}" --resume
python3 scripts/gpu/same_bits.py "$work/det_a" "$work/det_c" --json="$out/same_resume.json" \
  | tail -3 | tee -a "$out/summary.txt"
drop_states det_c

if [ "${DEFAULT:-2}" != 0 ]; then
  train def_a --config.train.checkpoints=False
fi
if [ "${DEFAULT:-2}" = 2 ]; then
  train def_b --config.train.checkpoints=False
  python3 scripts/gpu/same_bits.py "$work/def_a" "$work/def_b" --json="$out/same_default.json" \
    | tail -3 | tee -a "$out/summary.txt"
fi
df -h "$work" | tail -1 >>"$out/summary.txt"
