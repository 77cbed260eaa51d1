"""Runs a binary from a source checkout, installed or not (a machine where pip cannot
install, such as a GPU image with JAX and no fp8jax):

    python scripts/run.py fp8jax.experiments.train --config=experiments/configs/train_tiny.py

The checkout's ``models/`` and ``experiments/`` are mapped to ``fp8jax.models`` and
``fp8jax.experiments`` as an install maps them (``scripts/bench/_repo.py``), then the
module runs as ``python -m MODULE ARGS`` would run it. The project's dependencies must be
importable (jax, flax, optax, orbax, ml-collections, ...).
"""

import pathlib
import runpy
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "bench"))
import _repo  # noqa: E402,F401


def main() -> None:
  if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    print("usage: python scripts/run.py MODULE [ARGS...]  (e.g. fp8jax.experiments.train)",
          file=sys.stderr)
    sys.exit(2)
  module = sys.argv[1]
  sys.argv = [module, *sys.argv[2:]]
  runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  main()
