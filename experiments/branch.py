"""Branch-off runs: K more training steps from baseline checkpoints under BF16, a noise
floor and each precision policy, on identical batches.

    python -m fp8jax.experiments.branch --train_workdir=out/demo/train --out=out/demo/branch \
        --policies=sites --k=20 [--from_steps=0,100,200] [--noise=1]
    python -m fp8jax.experiments.report --results=out/demo/compare --branch=out/demo/branch

Writes ``<out>/branches.jsonl`` (per checkpoint and branch: loss gap, parameter divergence
per module and layer, update cosine, routing divergence, growth rate) and ``meta.json``;
rerunning continues where it stopped. The logic is :mod:`fp8jax.study.branches.branch`. Exit
status: 0 done, 2 bad input (found before any training step). Library INFO logs show only
with ``--verbosity=0``.
"""

import sys

from absl import flags

from fp8jax.experiments import _cli

_TRAIN = flags.DEFINE_string("train_workdir", None, "The baseline training run's folder.",
                             required=True)
_OUT = flags.DEFINE_string("out", None, "Results folder.", required=True)
_POLICIES = flags.DEFINE_list("policies", ["sites"], "Grid names or policy expressions.")
_FROM = flags.DEFINE_list("from_steps", [], "Checkpoints to branch from (default: all).")
_K = flags.DEFINE_integer("k", 20, "Training steps per branch.")
_NOISE = flags.DEFINE_integer("noise", 1, "Noise-floor branches (BF16 from weights perturbed "
                              "at BF16 rounding level).")
_NOISE_SEED = flags.DEFINE_integer("noise_seed", 0, "Seed of the noise-floor perturbations.")
_TOGETHER = flags.DEFINE_integer("max_together", 0, "Branches stepped together besides the "
                                 "reference (0: what fits in device memory).")
_DISTRIBUTED = _cli.define_distributed()
_DETERMINISTIC = flags.DEFINE_bool(
    "deterministic", None, "Deterministic mode: the same bits on every GPU run (XLA's "
    "autotuning off, one-hot embedding gradient, XLA attention; docs/determinism.md), at a "
    "cost in speed. Unset: the training run's own mode.")
_ALLOW = flags.DEFINE_bool("allow_policy_change", False, "Branch from checkpoints trained "
                           "under a policy other than BF16 (the reference continues in BF16).")


def main(argv):
  del argv
  from fp8jax.study.branches import branch  # pylint: disable=import-outside-toplevel
  from fp8jax.train import multihost  # pylint: disable=import-outside-toplevel

  try:
    _cli.start_processes(_DISTRIBUTED)
    summary = branch.run(
        _TRAIN.value, _OUT.value, policies=_POLICIES.value,
        from_steps=[int(s) for s in _FROM.value] or None,
        branches=branch.Branches(k=_K.value, noise=_NOISE.value, noise_seed=_NOISE_SEED.value),
        allow_policy_change=_ALLOW.value, max_together=_TOGETHER.value or None,
        deterministic=_DETERMINISTIC.value)
  except (ValueError, FileNotFoundError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"done: {summary['rows_written']} branch lines in {summary['out']}",
        file=multihost.main_stream(sys.stdout))
  return 0


if __name__ == "__main__":
  _cli.run(main)
