#!/usr/bin/env bash
# Sets up .venv if needed, then runs the main job on its embedded default: the whole
# precision study (a tiny DeepSeek-MoE trained on the embedded corpus with checkpoints,
# the site grid of FP8 policies compared on every checkpoint, the report), in out/demo.
#
#   bash scripts/demo.sh [FLAGS]        e.g. --out=/tmp/demo, --batches=4
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/scripts/setup.sh" dev,data,notebooks
cd "$repo"
exec .venv/bin/python -m fp8jax.experiments.study --out=out/demo "$@"
