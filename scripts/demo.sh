#!/usr/bin/env bash
# Sets up .venv if needed, then runs the main job on its embedded default.
#
#   bash scripts/demo.sh [FLAGS]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/scripts/setup.sh" dev
cd "$repo"
exec .venv/bin/python -m fp8jax.experiments.demo "$@"
