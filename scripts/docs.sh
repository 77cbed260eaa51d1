#!/usr/bin/env bash
# Builds the documentation site (mkdocs.yml: the pages of docs/, the README as the home
# page, and an API reference read from the docstrings) with --strict: a link into the site
# that does not resolve, a missing #anchor, a link to a file the repository lacks or an
# unresolved cross-reference fails the build. CI's step after the suite: 40 s on 2 cores
# with the set-up of .venv-docs, 7 s once set up.
#
#   bash scripts/docs.sh                  # builds site/ (open site/index.html)
#   bash scripts/docs.sh serve [ARGS]     # serves it, rebuilt on each change, on :8000
#   FP8JAX_SOURCE_URL=https://github.com/ORG/fp8jax/blob/main bash scripts/docs.sh
#                                         # links to files outside docs/ point there
#                                         # (unset: they are plain text)
#
# The tools are pyproject.toml's `docs` extra alone, in .venv-docs (griffe reads the source,
# so neither JAX nor fp8jax is installed there; .venv is left as the tests set it up).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo/.venv-docs"
if [ ! -x "$venv/bin/python" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then  # scripts/setup.sh found a Python >= 3.12 for it
    py=$("$repo/.venv/bin/python" -c 'import sys; print(sys._base_executable)')
  else
    py=${FP8JAX_PYTHON:-python3}
  fi
  "$py" -m venv "$venv"
fi
stamp="$venv/.fp8jax-installed"
want="$(sha256sum "$repo/pyproject.toml" | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "docs: installing pyproject.toml's docs extra into $venv"
  mapfile -t reqs < <("$venv/bin/python" -c '
import sys, tomllib
with open(sys.argv[1], "rb") as f:
  print(*tomllib.load(f)["project"]["optional-dependencies"]["docs"], sep="\n")' \
    "$repo/pyproject.toml")
  log="$venv/.install.log"
  if ! "$venv/bin/python" -m pip install --quiet "${reqs[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    echo "error: installing the docs extra failed (the output above is in $log)" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
cd "$repo"
export NO_MKDOCS_2_WARNING=1
if [[ ${1:-} == serve ]]; then
  shift
  exec "$venv/bin/mkdocs" serve "$@"
fi
exec "$venv/bin/mkdocs" build --strict --site-dir "$repo/site" "$@"
