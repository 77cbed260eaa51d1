r"""FP8 numerics study: accumulation, granularity, double quantization, delayed scaling;
MX / NVFP4 formats under outliers, stochastic rounding, the random Hadamard transform.

Flags and ``main`` only, over :mod:`fp8jax.study.formats.fp8_sections` and
:mod:`fp8jax.study.formats.mx_sections` (the studies) and :mod:`fp8jax.study.formats.writeup`
(figures, markdown, verdict). Writes ``numerics.json``, ``report.md`` and seven PNG figures
to ``--out``::

  python -m fp8jax.experiments.formats --out=out/formats
  python -m fp8jax.experiments.formats --quick --out=/tmp/numerics   # smoke size
"""

from __future__ import annotations

import dataclasses
import pathlib
import time

from absl import flags

from fp8jax.experiments import _cli
from fp8jax.study.formats import fp8_sections, mx_writeup, writeup
from fp8jax.train import multihost

_OUT = flags.DEFINE_string("out", "out/formats", "Output folder.")
_QUICK = flags.DEFINE_bool("quick", False, "Small sizes (seconds), for smoke tests.")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed.")


def main(argv):
  del argv
  multihost.quiet_library_logs(flags.FLAGS["verbosity"].present)
  sizes = fp8_sections.StudySizes.quick() if _QUICK.value else fp8_sections.StudySizes()
  sizes = dataclasses.replace(sizes, seed=_SEED.value)
  start = time.time()
  out = pathlib.Path(_OUT.value)
  results = writeup.run(out, sizes)
  v = writeup.deepseek_verdict(results)
  print(f"wrote {out}/report.md, numerics.json and figures in {time.time() - start:.0f} s")
  print(f"no promotion, K={v['k']}: same-sign operands {100 * v['positive_norm']:.2f}%, "
        f"zero-mean operands {100 * v['gaussian_norm']:.3f}% (normwise); "
        f"{v['bits_for_2pct']} fraction bits give 2% for same-sign operands")
  print(mx_writeup.headline(results))


if __name__ == "__main__":
  _cli.run(main)
