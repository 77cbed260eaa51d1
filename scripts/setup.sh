#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv.
#
#   bash scripts/setup.sh [EXTRAS]      # EXTRAS defaults to "dev", e.g. "dev,data"
#
# Finds a Python >= 3.12 (python3.12, python3, or pyenv's 3.12/3.13), creates .venv,
# and installs the project in editable mode with the given extras, constrained by
# constraints.txt. A second run with an unchanged pyproject.toml does nothing.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extras=${1:-dev}
venv="$repo/.venv"

is_py312() {
  "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null
}

find_python() {
  local candidates=()
  [ -n "${FP8JAX_PYTHON:-}" ] && candidates+=("$FP8JAX_PYTHON")
  candidates+=(python3.12 python3.13 python3)
  local root=${PYENV_ROOT:-$HOME/.pyenv}
  for p in "$root"/versions/3.1[2-9]*/bin/python3 /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do
    [ -x "$p" ] && candidates+=("$p")
  done
  for c in "${candidates[@]}"; do
    if command -v "$c" >/dev/null 2>&1 && is_py312 "$c"; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

if [ ! -x "$venv/bin/python" ] || ! is_py312 "$venv/bin/python"; then
  python=$(find_python) || {
    echo "error: fp8jax needs Python >= 3.12 and none was found (set FP8JAX_PYTHON)" >&2
    exit 1
  }
  echo "setup: creating $venv with $python ($("$python" --version))"
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi

stamp="$venv/.fp8jax-installed"
want="$(cat "$repo/pyproject.toml" "$repo/constraints.txt" | sha256sum | cut -c1-16) [$extras]"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: installing fp8jax[$extras] into $venv"
# pip's and the build backend's warnings go to a log, shown only if the install fails.
log="$venv/.fp8jax-install.log"
if ! { "$venv/bin/python" -m pip install --quiet --upgrade pip &&
       "$venv/bin/python" -m pip install --quiet -c "$repo/constraints.txt" \
           -e "$repo[$extras]"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "error: installing fp8jax[$extras] failed (the output above is in $log)" >&2
  exit 1
fi
echo "$want" > "$stamp"
