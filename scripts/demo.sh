#!/usr/bin/env bash
# Sets up .venv if needed, then runs the main job on its embedded default: the FP8
# numerics study, written to out/numerics (report.md, numerics.json, figures).
#
#   bash scripts/demo.sh [FLAGS]        e.g. --quick, --out=/tmp/numerics
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/scripts/setup.sh" dev
cd "$repo"
exec .venv/bin/python -m fp8jax.experiments.numerics --out=out/numerics "$@"
