"""Paired BF16/FP8 gradient comparison over a training run's checkpoints.

    python -m fp8jax.experiments.compare --train_workdir=out/train --out=out/compare \
        [--policies=sites] [--steps=0,500,1000] [--offsets=0,100] [--batches=4] \
        [--batch_size=8]

``--policies`` takes grid names (``seed`` = {attn, moe} x {layer 0, all layers} x
{e4m3, e5m2}; ``formats``; ``delayed`` = delayed vs current scaling) or policy expressions
(``attn@0-8:e4m3+gemm:fp32_blockwise``, ``attn@0:e4m3/delayed(h=1024,reduce=max,margin=0)``),
comma- or space-separated; ``noise(GRID)`` or ``noise(EXPR)`` adds noise-matched controls
(each quantization error replaced by random noise of the same energy per block). Every
(checkpoint, batch) also gets the noise floor (``--nofloor`` leaves it out). A
delayed-scaling policy's amax histories come from ``--delayed_warmup`` warm-up passes over
each evaluation window. The sweep resumes when
rerun with the same ``--out``. The evaluation batches come from the training run's data
(or ``--data``: a prepared folder or shards); data other than the checkpoints were trained
on is refused unless ``--allow_other_data``.
Each checkpoint is verified as it is read: a corrupt or incomplete one stops the sweep
(exit 2) unless ``--skip_corrupt_checkpoints``, which skips it without rows and names it. The
logic is :func:`fp8jax.study.comparison.sweep.run`; ``python -m fp8jax.experiments.report``
writes the report.
"""

import sys

from absl import flags

from fp8jax.experiments import _cli

_TRAIN = flags.DEFINE_string("train_workdir", "out/train", "Training run folder.")
_OUT = flags.DEFINE_string("out", "out/compare", "Results folder (resumable).")
_POLICIES = flags.DEFINE_list("policies", ["sites"], "Grid names or policy expressions.")
_STEPS = flags.DEFINE_list("steps", [], "Checkpoint steps (default: all).")
_OFFSETS = flags.DEFINE_list("offsets", ["0"], "Data offsets of the evaluation windows, in "
                             "batches.")
_BATCHES = flags.DEFINE_integer("batches", 2, "Evaluation batches per offset.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Sequences per evaluation batch.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 0, "Tokens per sequence (0: the training run's).")
_SEED = flags.DEFINE_integer("seed", 1234, "Shuffle seed of the evaluation batches.")
_SPLIT = flags.DEFINE_string("split", "", "Data split (default: the training run's).")
_MOE_IMPL = flags.DEFINE_enum("moe_impl", "dispatch", ["dispatch", "pallas", "reference"],
                              "MoE implementation of both passes ('pallas': the grouped-GEMM "
                              "kernel, GPU).")
_DATA = flags.DEFINE_string("data", "", "Evaluation data instead of the training run's: a "
                            "prepared folder (prepare_data --out), shard files/globs "
                            "(comma-separated) or tfds:<name>.")
_ALLOW_OTHER_DATA = flags.DEFINE_bool("allow_other_data", False,
                                      "Compare even if the evaluation data differs from "
                                      "the data the checkpoints were trained on.")
_DISTRIBUTED = _cli.define_distributed()
_DELAYED_WARMUP = flags.DEFINE_integer(
    "delayed_warmup", 4, "Warm-up passes (forward and backward) of each delayed-scaling "
    "policy over its evaluation window's batches in turn, filling the amax histories its "
    "rows are computed with (0: empty histories).")
_FLOOR = flags.DEFINE_bool("floor", True, "Also compare BF16 against BF16 at weights "
                           "perturbed at BF16 rounding level (the noise floor, rows of the "
                           "policy 'floor'): one more BF16 gradient per checkpoint and batch.")
_TELEMETRY = flags.DEFINE_bool("telemetry", True, "Record the block-scale telemetry of the "
                               "GEMM recipes' forward operands (scales, saturated, underflowing "
                               "and all-zero blocks, kurtosis) in their rows.")
_SCAN = flags.DEFINE_bool("scan_layers", False, "Alike consecutive layers as one lax.scan, "
                          "unrolled: traced once, compiled in a fraction of the layer loop's "
                          "time (fp8jax.models.layer_scan; docs/performance.md).")
_REPLICAS = flags.DEFINE_integer(
    "replicas", 0, "Data-parallel replicas, each taking the gradients of its own rows of a "
    "batch (0: one per device; a multiple of the devices computes on fewer devices what "
    "more would; fp8jax.train.data_parallel).")
_DETERMINISTIC = flags.DEFINE_bool(
    "deterministic", False, "Deterministic mode: the same bits on every GPU run (XLA's "
    "attention, a one-hot GEMM for the embedding gradient, no autotuning: "
    "docs/determinism.md), at a cost in speed.")
_SKIP_CORRUPT = flags.DEFINE_bool("skip_corrupt_checkpoints", False,
                                  "Skip checkpoints that fail verification (corrupt or "
                                  "incomplete; they get no rows) instead of stopping.")


def _ints(flag) -> tuple[int, ...]:
  try:
    return tuple(int(v) for v in flag.value)
  except ValueError:
    raise ValueError(f"--{flag.name} takes integers, got {','.join(flag.value)}") from None


def main(argv):
  del argv
  from fp8jax.data import pipeline  # pylint: disable=import-outside-toplevel
  from fp8jax.study.comparison import sweep  # pylint: disable=import-outside-toplevel
  from fp8jax.train import (
    checkpoint_digest,  # pylint: disable=import-outside-toplevel
    multihost,  # pylint: disable=import-outside-toplevel
  )

  try:
    windows = sweep.Windows(offsets=_ints(_OFFSETS), batches=_BATCHES.value,
                            batch_size=_BATCH_SIZE.value, seq_len=_SEQ_LEN.value,
                            seed=_SEED.value, split=_SPLIT.value)
    steps = _ints(_STEPS) or None
    _cli.start_processes(_DISTRIBUTED)
    summary = sweep.run(_TRAIN.value, _OUT.value, policies=_POLICIES.value, steps=steps,
                        windows=windows, moe_impl=_MOE_IMPL.value,
                        skip_corrupt=_SKIP_CORRUPT.value,
                        data=pipeline.override(_DATA.value) if _DATA.value else None,
                        allow_other_data=_ALLOW_OTHER_DATA.value,
                        delayed_warmup=_DELAYED_WARMUP.value, floor=_FLOOR.value,
                        telemetry=_TELEMETRY.value, deterministic=_DETERMINISTIC.value,
                        scan_layers=_SCAN.value, replicas=_REPLICAS.value)
  except checkpoint_digest.CheckpointError as e:  # found when the checkpoint is read
    print(f"error: {e}; no row was written from it (python -m fp8jax.experiments.verify "
          "checks every checkpoint; --skip_corrupt_checkpoints compares the others)",
          file=sys.stderr)
    return 2
  except (ValueError, FileNotFoundError, KeyError, ImportError) as e:
    print(f"error: {e}", file=sys.stderr)  # bad input, found before any compute
    return 2
  skipped = summary["skipped"]
  print(f"done: {summary['rows_written']} new rows in {summary['out']}"
        + (f"; skipped corrupt or incomplete checkpoints {sorted(skipped)}" if skipped else ""),
        file=multihost.main_stream(sys.stdout))
  return 0


if __name__ == "__main__":
  _cli.run(main)
