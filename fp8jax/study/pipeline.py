"""The study end to end: baseline training, the comparison sweep, the report.

In a multi-process run every process trains and compares; process 0 alone prints and
writes the report.
"""

from __future__ import annotations

import pathlib
import sys
import time

from fp8jax.study import report, sweep
from fp8jax.train import loop, multihost


def run_study(train_config, out, policies=("seed",), windows: sweep.Windows | None = None,
              stream=None, delayed_warmup: int = sweep.DELAYED_WARMUP) -> pathlib.Path:
  """Trains (or resumes) ``train_config`` in ``<out>/train``, compares ``policies`` on
  every checkpoint in ``<out>/compare`` (``delayed_warmup``: see :func:`sweep.run`) and
  returns the path of the report."""
  stream = multihost.main_stream(stream or sys.stderr)
  windows = windows or sweep.Windows()
  out = pathlib.Path(out)
  t0 = time.perf_counter()

  def stage(text):
    print(f"[study] {text} ({time.perf_counter() - t0:.0f} s)", file=stream, flush=True)

  stage("1/3 training the baseline")
  train_dir = out / "train"
  has_run = (train_dir / "checkpoints").exists()
  loop.train(train_config, train_dir, resume=has_run, stream=stream)
  stage("2/3 comparing the precision policies on every checkpoint")
  sweep.run(train_dir, out / "compare", policies=policies, windows=windows, stream=stream,
            moe_impl=train_config.train.moe_impl, delayed_warmup=delayed_warmup)
  stage("3/3 writing the report")
  path = (report.write_report(out / "compare") if multihost.is_main()
          else out / "compare" / "report.md")
  stage(f"done: {path}")
  return pathlib.Path(path)
