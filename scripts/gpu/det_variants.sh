#!/usr/bin/env bash
# Which XLA determinism flags compile and run the 2-layer 2B-width training step? Three
# steps per variant, no checkpoints, full tracebacks; prints one line per variant and
# writes the XLA flags of the first variant marked '*' that ran to OUT/chosen.
#   bash scripts/gpu/det_variants.sh OUT_DIR 'XLA FLAGS|EXTRA ARGS' ...
# e.g. '*--xla_gpu_deterministic_ops=true|' '--xla_gpu_deterministic_ops=true|--config.data.global_batch=2'
set -uo pipefail
out=${1:?usage: det_variants.sh OUT_DIR VARIANT...}; shift
mkdir -p "$out"
args=(--config=experiments/configs/train_2b8l_full.py --config.model_overrides.num_hidden_layers=2
      --config.train.steps=3 --config.optim.warmup_steps=1 --config.train.checkpoints=False
      --config.train.log_every=1)
i=0
for spec in "$@"; do
  i=$((i + 1))
  flags=${spec%%|*}; extra=${spec#*|}; pick=0
  [ "${flags:0:1}" = "*" ] && { pick=1; flags=${flags:1}; }
  read -r -a extra_args <<<"$extra"
  t0=$SECONDS
  XLA_FLAGS="$flags" JAX_TRACEBACK_FILTERING=off PYTHONUNBUFFERED=1 python3 scripts/run.py \
    fp8jax.experiments.train "${args[@]}" "${extra_args[@]}" --workdir=/tmp/detv/$i \
    >"$out/variant$i.log" 2>&1
  rc=$?
  echo "variant $i [$flags] [$extra]: exit $rc after $((SECONDS - t0)) s" | tee -a "$out/variants.txt"
  if [ $rc = 0 ] && [ $pick = 1 ] && [ ! -f "$out/chosen" ]; then echo "$flags" >"$out/chosen"; fi
done
