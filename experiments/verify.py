"""Verifies every checkpoint of a training run, or a prepared data folder: one line each.

    python -m fp8jax.experiments.verify --workdir=out/train
    python -m fp8jax.experiments.verify --data=$WORK/c4_8k     # a prepare_data folder

Each line is ``<checkpoint folder>: ok`` / ``corrupt: array <path> has digest ..., its save
recorded ...`` / ``corrupt: data position <file> has digest ...`` (an edited or damaged
data position) / ``incomplete: does not restore (...)`` / ``not verified: no digests``
(written before checkpoints carried digests); a count goes to stderr. Exits 1 when a
checkpoint is corrupt or incomplete, 2 on bad input. The logic is
:func:`fp8jax.train.verify.verify_run`.

``--data`` reads every record of every token file of a prepared folder instead
(:func:`fp8jax.data.prepared.verify`): ``<token file>: ok`` or ``corrupt: ...`` (it does not
read, or its counts differ from the manifest's); exits 1 when one is corrupt, 2 when the
folder itself is not a complete preparation (no manifest, a file missing or of another
size).
"""

import sys

from absl import flags

from fp8jax.experiments import _cli
from fp8jax.train import multihost

_WORKDIR = flags.DEFINE_string("workdir", "out/train", "Training run folder.")
_DATA = flags.DEFINE_string("data", None, "A prepared data folder (prepare_data --out) to "
                            "verify instead of a run's checkpoints.")


def verify_data(folder: str) -> int:
  from fp8jax.data import prepared  # pylint: disable=import-outside-toplevel

  try:
    statuses = prepared.verify(folder)
  except (ValueError, FileNotFoundError, KeyError, ImportError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  for name, status in statuses:
    print(f"{folder}/{name}: {status}")
  bad = [name for name, status in statuses if status != "ok"]
  print(f"{len(statuses)} token files, {len(bad)} corrupt", file=sys.stderr)
  return 1 if bad else 0


def main(argv):
  del argv
  multihost.quiet_library_logs(flags.FLAGS["verbosity"].present)
  if _DATA.value is not None:
    return verify_data(_DATA.value)
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
