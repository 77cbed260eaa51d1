r"""Overlays several full training runs: report.md and PNG figures (loss, error, norms).

    python -m fp8jax.experiments.compare_runs --runs=out/bf16,out/fp8 --out=out/cmp \
        [--reference=0] [--tail=0.1] [--allow_mismatch]

Each ``--runs`` entry is a folder of ``python -m fp8jax.experiments.train``. The runs are
aligned on their common logged steps; the final relative loss error against the
``--reference`` run is the mean over the last ``--tail`` fraction of those steps, with a
95% CI, checked against DeepSeek-V3's 0.25%. Runs that differ in model or data are refused
unless ``--allow_mismatch``. The logic is :func:`fp8jax.study.runs.overlay.write_report`.
Exit status: 0 done, 2 bad input.
"""

import sys

from absl import flags

from fp8jax.experiments import _cli

_RUNS = flags.DEFINE_list("runs", None, "Training run folders, comma-separated.",
                          required=True)
_OUT = flags.DEFINE_string("out", None, "Output folder of report.md and the figures.",
                           required=True)
_REFERENCE = flags.DEFINE_integer("reference", 0, "Index in --runs of the reference run.")
_TAIL = flags.DEFINE_float("tail", 0.1, "Fraction of the last common steps averaged into "
                           "the final relative loss error (at least one step).")
_METRIC = flags.DEFINE_enum("metric", "loss", ["loss", "lm_loss"], "The loss compared: the "
                            "training objective (LM + balance loss) or the LM loss alone.")
_ALLOW_MISMATCH = flags.DEFINE_bool("allow_mismatch", False,
                                    "Compare runs that differ in model or data.")


def main(argv):
  del argv
  from fp8jax.study.runs import overlay  # pylint: disable=import-outside-toplevel

  try:
    path = overlay.write_report(_RUNS.value, _OUT.value, reference=_REFERENCE.value,
                                    tail=_TAIL.value, allow_mismatch=_ALLOW_MISMATCH.value,
                                    metric=_METRIC.value)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  _cli.run(main)
