"""Trains DeepSeek-MoE (BF16 baseline or any precision policy) with checkpoints from step 0.

    python -m fp8jax.experiments.train --config=experiments/configs/train_tiny.py \
        --workdir=out/train [--config.train.steps=400] [--resume [--allow_policy_change]]

The config files in ``experiments/configs/`` document their commands. The run logic is
:func:`fp8jax.train.loop.train`; this binary only parses flags. Exit status: 0 done, 2 bad
input (a ``--resume`` under another policy than the checkpoint records, without
``--allow_policy_change``, included), 3 non-finite step, 75 preempted (SIGTERM: saved at
the next step; ``--resume``). Training-precision options: ``--config.precision.*``
(``fp8jax.train.run_config``).
Library INFO logs (Orbax, absl) show only with ``--verbosity=0``.
"""

import pathlib
import sys

from absl import flags

from fp8jax.experiments import _cli

_DEFAULT_CONFIG = pathlib.Path(__file__).parent / "configs" / "train_tiny.py"

_CONFIG = _cli.define_config_file("config", str(_DEFAULT_CONFIG),
                                          "Run config file (experiments/configs/train_*.py).")
_WORKDIR = flags.DEFINE_string("workdir", "out/train", "Output folder of the run.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue the run in --workdir.")
_ALLOW_POLICY_CHANGE = flags.DEFINE_bool(
    "allow_policy_change", False,
    "With --resume: continue under a precision policy other than the checkpoint records.")
_DISTRIBUTED = _cli.define_distributed()


def main(argv):
  del argv
  from fp8jax.train import (  # pylint: disable=import-outside-toplevel
    loop,
    multihost,
    preemption,
  )

  try:
    _cli.start_processes(_DISTRIBUTED)
    summary = loop.train(_CONFIG.value, _WORKDIR.value, resume=_RESUME.value,
                         allow_policy_change=_ALLOW_POLICY_CHANGE.value)
  except loop.NonFiniteError as e:
    print(f"error: {e}", file=sys.stderr)
    return 3
  except preemption.Preempted as e:
    print(e, file=multihost.main_stream(sys.stderr))
    return preemption.EXIT_CODE
  except (ValueError, FileNotFoundError, FileExistsError, KeyError, ImportError) as e:
    print(f"error: {e}", file=sys.stderr)  # bad input, found before any compute
    return 2
  where = (f"checkpoints in {summary['workdir']}" if summary.get("checkpoints", True)
           else "no checkpoints (train.checkpoints=False)")
  if summary.get("already_finished"):
    loss = summary["final_loss"]
    print(f"done: the run was already finished at step {summary['final_step']}"
          f"{'' if loss is None else f', last loss {loss}'}; nothing to do, {where}",
          file=multihost.main_stream(sys.stdout))
    return 0
  print(f"done: step {summary['final_step']}, loss {summary['final_loss']}, {where}",
        file=multihost.main_stream(sys.stdout))
  return 0


if __name__ == "__main__":
  _cli.run(main)
