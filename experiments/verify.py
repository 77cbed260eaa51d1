"""Verifies every checkpoint of a training run: one line per checkpoint.

    python -m fp8jax.experiments.verify --workdir=out/train

Each line is ``<checkpoint folder>: ok`` / ``corrupt: array <path> has digest ..., its save
recorded ...`` / ``corrupt: data position <file> has digest ...`` (an edited or damaged
data position) / ``incomplete: does not restore (...)`` / ``not verified: no digests``
(written before checkpoints carried digests); a count goes to stderr. Exits 1 when a
checkpoint is corrupt or incomplete, 2 on bad input. The logic is
:func:`fp8jax.train.verify.verify_run`.
"""

import sys

from absl import flags

from fp8jax.experiments import _cli
from fp8jax.train import multihost

_WORKDIR = flags.DEFINE_string("workdir", "out/train", "Training run folder.")


def main(argv):
  del argv
  multihost.quiet_library_logs(flags.FLAGS["verbosity"].present)
  from fp8jax.train import checkpoint_digest, verify  # pylint: disable=import-outside-toplevel

  try:
    statuses = verify.verify_run(_WORKDIR.value)
  except (ValueError, FileNotFoundError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if not statuses:
    print(f"error: no checkpoints in {_WORKDIR.value}/checkpoints", file=sys.stderr)
    return 2
  for _, status in statuses:
    print(f"{status.checkpoint}: {checkpoint_digest.describe(status)}")
  bad = [step for step, status in statuses if not verify.is_usable(status)]
  print(f"{len(statuses)} checkpoints, {len(bad)} corrupt or incomplete"
        + (f" (steps {bad})" if bad else ""), file=sys.stderr)
  return 1 if bad else 0

if __name__ == "__main__":
  _cli.run(main)
