#!/usr/bin/env bash
# Sets up .venv if needed, then runs the CPU test suite: every test not marked `slow`
# (CI's first step). `-m slow` runs the slow tier alone (CI's second step), `--all` both
# at once; a `-m EXPR` of your own replaces the default selection.
#
#   bash scripts/test.sh [--all] [PYTEST ARGS]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/scripts/setup.sh" dev,data,notebooks
cd "$repo"
export JAX_PLATFORMS=cpu
select=(-m "not slow")
if [[ ${1:-} == --all ]]; then
  shift
  select=()
fi
exec .venv/bin/python -m pytest -n auto "${select[@]}" "$@"
