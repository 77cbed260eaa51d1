r"""Report of a precision comparison sweep: report.md and PNG figures.

Reads the folder written by the comparison sweep (meta.json, rows.jsonl, details.jsonl,
baseline.jsonl, weights.jsonl) and writes ``report.md`` and ``figures/*.png``, naming the
reference by the precision the sweep read from the model (``meta.json``'s ``reference``,
e.g. "FP32 reference"; a folder written before it was recorded reads as BF16)::

  python -m fp8jax.experiments.report --results=out/compare
  python -m fp8jax.experiments.report --results=out/compare --out=/tmp/report --top_k=20
  python -m fp8jax.experiments.report --results=out/compare --branch=out/branch
  python -m fp8jax.experiments.report --results=out/part0,out/part1 --out=out/compare

With the branch-off study's folder (``--branch``; by default ``<results>/../branch`` when it
holds ``branches.jsonl``) the report also answers "Does the one-step perturbation predict the
trajectory?". With a validation matrix's summary (``--validation=out/val/summary.json``) it
also ranks the sweep's recipes (``gemm:*``) against the full runs' gaps to BF16. Several
``--results`` folders are parts of one sweep (the same checkpoints, each process over some
policies or evaluation offsets): they are merged into ``--out``, then reported.
"""

from __future__ import annotations

from absl import flags

from fp8jax.experiments import _cli
from fp8jax.study import sweep_report
from fp8jax.study.common import results as results_lib
from fp8jax.train import multihost

_RESULTS = flags.DEFINE_list("results", None, "Folder of the comparison sweep, or the "
                             "folders of its parts (merged into --out).", required=True)
_OUT = flags.DEFINE_string("out", None, "Output folder (default: --results; required with "
                           "several).")
_TOP_K = flags.DEFINE_integer("top_k", 10, "Depth of the parameter rankings.")
_VALIDATION = flags.DEFINE_string(
    "validation", None, "A validation matrix's summary.json (validate): rank the sweep's "
    "recipes against the full runs' gaps in the trajectory section.")
_BRANCH = flags.DEFINE_string("branch", None, "Folder of the branch-off study (default: "
                              "<results>/../branch when it holds branches.jsonl).")


def main(argv):
  del argv
  multihost.quiet_library_logs(flags.FLAGS["verbosity"].present)
  try:
    results = _RESULTS.value[0]
    if len(_RESULTS.value) > 1:
      if not _OUT.value:
        _cli.fail("--results names several parts: give --out, the merged sweep's folder")
      results = results_lib.save(results_lib.merge(
          [results_lib.load(p) for p in _RESULTS.value]), _OUT.value)
      print(f"merged {len(_RESULTS.value)} parts into {results}")
    path = sweep_report.write_report(results, out=_OUT.value, top_k=_TOP_K.value,
                               branch=_BRANCH.value, validation=_VALIDATION.value)
  except (ValueError, FileNotFoundError) as e:  # a missing or damaged results folder
    _cli.fail(str(e))
  print(f"wrote {path}")


if __name__ == "__main__":
  _cli.run(main)
