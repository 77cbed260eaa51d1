"""The study end to end: baseline training, the comparison sweep, the branch-off runs
(optional), the report.

In a multi-process run every process trains and compares; process 0 alone prints and
writes the report. The study folder is locked for the whole run
(:mod:`fp8jax.data.folder_lock`), and each stage locks its own subfolder.
"""

from __future__ import annotations

import pathlib
import sys
import time

from fp8jax.study import sweep_report
from fp8jax.study.branches import branch
from fp8jax.study.comparison import sweep
from fp8jax.train import loop, multihost


def run_study(train_config, out, policies=("sites",), windows: sweep.Windows | None = None,
              stream=None, delayed_warmup: int = sweep.DELAYED_WARMUP,
              branches: branch.Branches | None = None, controls=()) -> pathlib.Path:
  """Trains (or resumes) ``train_config`` in ``<out>/train``, compares ``policies`` and the
  noise-matched ``controls`` (policy expressions, e.g.
  :func:`fp8jax.study.comparison.policies.site_controls`) on every
  checkpoint in ``<out>/compare``, with the noise floor (``delayed_warmup``: see
  :func:`sweep.run`), with ``branches`` runs ``branches.k`` steps of every policy (not the
  controls) from every checkpoint in ``<out>/branch`` (:func:`branch.run`), and returns the
  path of the report (which then relates the one-step comparison to the trajectories)."""
  stream = multihost.main_stream(stream or sys.stderr)
  windows = windows or sweep.Windows()
  out = pathlib.Path(out)
  t0 = time.perf_counter()

  def stage(text):
    print(f"[study] {text} ({time.perf_counter() - t0:.0f} s)", file=stream, flush=True)

  with multihost.lock_folder(out):  # one study per folder; its stages lock their own
    n = 4 if branches else 3
    stage(f"1/{n} training the baseline")
    train_dir = out / "train"
    has_run = (train_dir / "checkpoints").exists()
    loop.train(train_config, train_dir, resume=has_run, stream=stream)
    stage(f"2/{n} comparing the precision policies on every checkpoint")
    sweep.run(train_dir, out / "compare", policies=[*policies, *controls], windows=windows,
              stream=stream, moe_impl=train_config.train.moe_impl,
              delayed_warmup=delayed_warmup, deterministic=train_config.train.deterministic,
              scan_layers=train_config.train.scan_layers,
              replicas=train_config.train.get("replicas", 0))
    if branches:
      stage(f"3/{n} branch-off runs: {branches.k} steps of each policy from every checkpoint")
      branch.run(train_dir, out / "branch", policies=policies, branches=branches, stream=stream)
    stage(f"{n}/{n} writing the report")
    path = (sweep_report.write_report(out / "compare", branch=out / "branch" if branches else None)
            if multihost.is_main()
            else out / "compare" / "report.md")
    stage(f"done: {path}")
  return pathlib.Path(path)
