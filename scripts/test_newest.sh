#!/usr/bin/env bash
# The second, smaller CI job: the newest versions that pyproject.toml allows (no
# constraints.txt), so every declared range is tested at both ends (the main suite pins the
# GPU image's jax 0.11.2). Creates .venv-newest if needed and runs the fast tier of the
# numerics (formats, scales, MX rounding, GEMMs), model and training-step tests on it.
#
#   bash scripts/test_newest.sh [PYTEST ARGS]     (default: -n auto)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo/.venv-newest"
base="$repo/.venv/bin/python"   # scripts/setup.sh found a Python >= 3.12 for it
[ -x "$base" ] || bash "$repo/scripts/setup.sh" dev
if [ ! -x "$venv/bin/python" ]; then
  py=$("$base" -c 'import sys; print(sys._base_executable)')
  "$py" -m venv "$venv"
fi
stamp="$venv/.fp8jax-installed"
want="$(sha256sum "$repo/pyproject.toml" | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "test_newest: installing fp8jax[dev] with the newest allowed versions into $venv"
  log="$venv/.install.log"
  if ! { "$venv/bin/python" -m pip install --quiet --upgrade pip &&
         "$venv/bin/python" -m pip install --quiet --upgrade --upgrade-strategy eager \
           -e "$repo[dev]"; } >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
cd "$repo"
export JAX_PLATFORMS=cpu
"$venv/bin/python" -c 'import jax, flax, optax, orbax.checkpoint as o; print(
    f"test_newest: jax {jax.__version__}, flax {flax.__version__}, optax {optax.__version__}")'
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-n auto)
exec "$venv/bin/python" -m pytest -m "not slow" "${args[@]}" tests/quant/test_quantize.py \
  tests/numerics/test_mx_formats.py tests/numerics/test_mx_spec.py tests/numerics/test_mx_rounding.py tests/gemm/test_dense.py \
  tests/models/test_deepseek_moe.py tests/train/test_step.py
