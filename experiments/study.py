"""The whole study in one command: train a baseline, compare the site grid on every
checkpoint, branch off K training steps of each policy, write the report.

    python -m fp8jax.experiments.study --out=out/demo                 # the embedded demo
    python -m fp8jax.experiments.study --config=experiments/configs/train_2b_c4.py \
        --out=$WORK/ds2b --offsets=0,1000,2000 --batches=4 --batch_size=16

Writes ``<out>/train`` (checkpoints, metrics), ``<out>/compare`` (rows, details),
``<out>/branch`` (branch-off trajectories; ``--branch_k=0`` skips them) and
``<out>/compare/report.md`` with its figures. Rerunning continues where it stopped.
Library INFO logs (Orbax, absl) show only with ``--verbosity=0``; ``--distributed`` runs
it over several processes (docs/multihost.md).
"""

import pathlib
import sys

from absl import flags

from fp8jax.experiments import _cli

_CONFIG = _cli.define_config_file(
    "config", str(pathlib.Path(__file__).parent / "configs" / "train_tiny.py"),
    "Training run config (experiments/configs/train_*.py).")
_OUT = flags.DEFINE_string("out", "out/demo", "Output folder.")
_POLICIES = flags.DEFINE_list(
    "policies", ["sites_small"], "Grid names or policy expressions (sites_small: the part of "
    "the site grid that answers each question once; sites: the whole grid).")
_OFFSETS = flags.DEFINE_list("offsets", ["0", "10"], "Evaluation window offsets (batches).")
_BATCHES = flags.DEFINE_integer("batches", 2, "Evaluation batches per offset.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Sequences per evaluation batch.")
_DELAYED_WARMUP = flags.DEFINE_integer(
    "delayed_warmup", 4, "Warm-up passes of each delayed-scaling policy over its evaluation "
    "window, filling its amax histories (0: empty histories).")
_BRANCH_K = flags.DEFINE_integer(
    "branch_k", 4, "Training steps of each policy's branch from every checkpoint, with a BF16 "
    "reference and a noise-floor branch (0: no branch-off runs).")
_SITE_CONTROLS = flags.DEFINE_bool(
    "site_controls", True, "Also compare the noise-matched controls of the all-layer E4M3 "
    "site-grid policies among --policies (each quantization error replaced by random noise "
    "of the same energy per block).")
_DISTRIBUTED = _cli.define_distributed()


def main(argv):
  del argv
  from fp8jax.study import pipeline  # pylint: disable=import-outside-toplevel
  from fp8jax.study.branches import branch  # pylint: disable=import-outside-toplevel
  from fp8jax.study.comparison import (  # pylint: disable=import-outside-toplevel
    policies,
    sweep,
  )
  from fp8jax.train import (  # pylint: disable=import-outside-toplevel
    multihost,
    preemption,
    run_config,
  )

  try:
    windows = sweep.Windows(offsets=tuple(int(o) for o in _OFFSETS.value),
                            batches=_BATCHES.value, batch_size=_BATCH_SIZE.value)
    _cli.start_processes(_DISTRIBUTED)
    model = run_config.model(_CONFIG.value)
    controls = (policies.site_controls(policies.expand_policies(_POLICIES.value, model))
                if _SITE_CONTROLS.value else [])
    report = pipeline.run_study(_CONFIG.value, _OUT.value, policies=_POLICIES.value,
                                windows=windows, delayed_warmup=_DELAYED_WARMUP.value,
                                controls=controls,
                                branches=(branch.Branches(k=_BRANCH_K.value)
                                          if _BRANCH_K.value else None))
  except preemption.Preempted as e:
    print(e, file=multihost.main_stream(sys.stderr))
    return preemption.EXIT_CODE
  except (ValueError, FileNotFoundError, FileExistsError, KeyError, ImportError) as e:
    print(f"error: {e}", file=sys.stderr)  # bad input, found before any compute
    return 2
  print(f"report: {report}", file=multihost.main_stream(sys.stdout))
  return 0


if __name__ == "__main__":
  _cli.run(main)
