"""The validation matrix: recipes x seeds of full training runs, resumable, with their gaps
to BF16 against BF16's seed-to-seed spread (docs/validation.md).

    python -m fp8jax.experiments.validate --config=experiments/configs/train_tiny.py \
        --out=out/validation --recipes=bf16,gemm:fp32_blockwise --seeds=0-2 \
        [--deadline_s=540] [--metric=lm_loss] [--bound=0.0025] \
        [--contrast="gemm:mxfp4 vs gemm:nvfp4" ...] [--one_step=out/one_step]

Every (recipe, seed) trains with the config (policy and init seed replaced) in
``<out>/runs/<recipe>_s<seed>``; finished runs are skipped, stopped ones resume, so the
same command continues the matrix across calls. ``--deadline_s``: no run starts after that
many seconds, and a running one saves a checkpoint and stops then (exit 75: run the command
again). Several copies of the command may share one ``--out`` (e.g. one GPU): each takes
the runs no other holds; ``--group_seeds`` trains a recipe's seeds in one process, the step
vmapped over seeds (one compilation per recipe). Writes ``<out>/summary.md``,
``summary.json`` and the figure ``validation.png`` (loss and gap to BF16 over training,
seed bands). ``--one_step``: a folder of ``compare`` runs of the recipes on checkpoints of
BF16 runs of the same config (``<folder>/s<seed>``, ``scripts/gpu/one_step_loop.sh``); the
summary then says whether the one-step ranking of the recipes predicts the full runs'
(Spearman over recipes). ``--config.train.eval_precision=bf16``: each run also logs the
loss of every logged batch in the model's BF16 forward, and the summary compares those
(trained in the recipe, evaluated in BF16; ``=train``: the same forward in the recipe;
:mod:`fp8jax.train.evaluation`). The logic is :mod:`fp8jax.study.runs.validation`.
"""

import pathlib
import sys
import time

from absl import flags

from fp8jax.experiments import _cli

_DEFAULT_CONFIG = pathlib.Path(__file__).parent / "configs" / "train_tiny.py"

_CONFIG = _cli.define_config_file("config", str(_DEFAULT_CONFIG),
                                  "Run config of every run (experiments/configs/train_*.py).")
_OUT = flags.DEFINE_string("out", "out/validation", "Output folder of the matrix.")
_RECIPES = flags.DEFINE_list("recipes", ["bf16", "gemm:fp32_blockwise"],
                             "Policy expressions, bf16 (the reference) among them.")
_SEEDS = flags.DEFINE_list("seeds", ["0-2"], "Init seeds: 0,1,2 or 0-2.")
_DEADLINE = flags.DEFINE_float("deadline_s", 0.0, "Stop after this many seconds (0: none).")
_METRIC = flags.DEFINE_enum("metric", "lm_loss", ["loss", "lm_loss"], "The loss compared.")
_TAIL = flags.DEFINE_float("tail", 0.1, "Share of the last logged steps averaged.")
_BOUND = flags.DEFINE_float("bound", 0.0025, "Relative gap the verdicts are against.")
_CONTRAST = flags.DEFINE_multi_string(
    "contrast", [], "'RECIPE_A vs RECIPE_B': the paired difference of their gaps over seeds "
    "(repeatable).")
_GROUP = flags.DEFINE_bool(
    "group_seeds", False, "Train a recipe's seeds together in this process, the step vmapped "
    "over seeds: one compilation per recipe (runs without checkpoints, one device).")
_ONE_STEP = flags.DEFINE_string(
    "one_step", "", "Folder of one-step comparisons on checkpoints of BF16 runs of this "
    "config, <folder>/s<seed> (scripts/gpu/one_step_loop.sh): rank agreement with the gaps.")


def main(argv):
  del argv
  from fp8jax.study.runs import validation  # pylint: disable=import-outside-toplevel
  from fp8jax.train import preemption  # pylint: disable=import-outside-toplevel

  start = time.monotonic()
  try:
    matrix = validation.Matrix(tuple(_RECIPES.value), validation.parse_seeds(_SEEDS.value))
    contrasts = [validation.parse_contrast(c, matrix) for c in _CONTRAST.value]
    outcome = validation.run_matrix(
        _CONFIG.value, _OUT.value, matrix,
        deadline=start + _DEADLINE.value if _DEADLINE.value > 0 else None,
        group_seeds=_GROUP.value)
    summary = validation.summarize(_OUT.value, matrix, _METRIC.value, _TAIL.value,
                                   _BOUND.value, contrasts, _ONE_STEP.value or None)
    figure = None
    if summary["recipes"][validation.REFERENCE]["tail"]:  # a finished BF16 run to draw against
      from fp8jax.study.runs import validation_figures  # pylint: disable=import-outside-toplevel
      figure = validation_figures.draw(_OUT.value, matrix, summary["column"] or _METRIC.value)
  except (ValueError, FileNotFoundError, FileExistsError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"done: {len(outcome['done'])} of {len(matrix.runs())} runs finished, "
        f"{len(outcome['stopped'])} stopped at the deadline, {len(outcome['pending'])} not "
        f"started, {len(outcome['busy'])} trained by other processes; "
        f"{pathlib.Path(_OUT.value) / 'summary.md'}"
        + ("" if not summary["missing"] else " (partial)")
        + (f", {figure}" if figure else ""), file=sys.stdout)
  return preemption.EXIT_CODE if summary["missing"] else 0


if __name__ == "__main__":
  _cli.run(main)
