r"""Report of a precision comparison sweep: report.md and PNG figures.

Reads the folder written by the comparison sweep (meta.json, rows.jsonl, details.jsonl,
baseline.jsonl, weights.jsonl) and writes ``report.md`` and ``figures/*.png``::

  python -m fp8jax.experiments.report --results=out/compare
  python -m fp8jax.experiments.report --results=out/compare --out=/tmp/report --top_k=20
"""

from __future__ import annotations

from absl import app, flags

from fp8jax.study import report
from fp8jax.train import multihost

_RESULTS = flags.DEFINE_string("results", None, "Folder of the comparison sweep.",
                               required=True)
_OUT = flags.DEFINE_string("out", None, "Output folder (default: --results).")
_TOP_K = flags.DEFINE_integer("top_k", 10, "Depth of the parameter rankings.")


def main(argv):
  del argv
  multihost.quiet_library_logs(flags.FLAGS["verbosity"].present)
  path = report.write_report(_RESULTS.value, out=_OUT.value, top_k=_TOP_K.value)
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
