"""The whole study in one command: train a baseline, compare the seed grid, write the report.

    python -m fp8jax.experiments.study --out=out/demo                 # the embedded demo
    python -m fp8jax.experiments.study --config=experiments/configs/train_2b_c4.py \
        --out=$WORK/ds2b --offsets=0,1000,2000 --batches=4 --batch_size=16

Writes ``<out>/train`` (checkpoints, metrics), ``<out>/compare`` (rows, details) and
``<out>/compare/report.md`` with its figures. Rerunning continues where it stopped.
"""

import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(pathlib.Path(__file__).parent / "configs" / "train_tiny.py"),
    "Training run config (experiments/configs/train_*.py).")
_OUT = flags.DEFINE_string("out", "out/demo", "Output folder.")
_POLICIES = flags.DEFINE_list("policies", ["seed"], "Grid names or policy expressions.")
_OFFSETS = flags.DEFINE_list("offsets", ["0", "10"], "Evaluation window offsets (batches).")
_BATCHES = flags.DEFINE_integer("batches", 2, "Evaluation batches per offset.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Sequences per evaluation batch.")


def main(argv):
  del argv
  from fp8jax.study import (
    pipeline,  # pylint: disable=import-outside-toplevel
    sweep,  # pylint: disable=import-outside-toplevel
  )

  windows = sweep.Windows(offsets=tuple(int(o) for o in _OFFSETS.value),
                          batches=_BATCHES.value, batch_size=_BATCH_SIZE.value)
  try:
    report = pipeline.run_study(_CONFIG.value, _OUT.value, policies=_POLICIES.value,
                                windows=windows)
  except (ValueError, FileNotFoundError, FileExistsError, KeyError, ImportError) as e:
    print(f"error: {e}", file=sys.stderr)  # bad input, found before any compute
    return 2
  print(f"report: {report}")
  return 0


if __name__ == "__main__":
  app.run(main)
