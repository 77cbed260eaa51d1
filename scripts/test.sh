#!/usr/bin/env bash
# Sets up .venv if needed, then runs the CPU test suite (what CI runs).
#
#   bash scripts/test.sh [PYTEST ARGS]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/scripts/setup.sh" dev,data,notebooks
cd "$repo"
export JAX_PLATFORMS=cpu
exec .venv/bin/python -m pytest -n auto "$@"
