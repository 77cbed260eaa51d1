"""Where a branch-off run's time goes when a checkpoint's branches run in groups: each
checkpoint restore, each group's state handed over (the restored state, a copy back from
host memory, or the checkpoint read again) and each group's k steps beside the reference.

    python scripts/bench/branch_groups.py --train_workdir=RUN --branch_out=DIR \
        --policies=attn_l0_e4m3,moe_l0_e4m3 --k=8 [--max_together=1] [--no-keep_restored] \
        [--out=$OUT/branch_groups.json]

One ``branch.run`` per process (``--branch_out`` is emptied first), timed by wrapping the
engine's ``restore`` and ``run_group`` and the restored state's ``take`` (each blocks
until its arrays are ready; ``run_group`` returns host rows, so it is synchronous). The
row holds the run's summary (groups, branches together), every phase's seconds, the
seconds per step of a group (the reference and its branches), the seconds per branch
step with the restores and hand-overs (what a branch point costs per policy and step),
the wall time of the whole run with its compiles, and the first device's peak memory.
"""

import argparse
import functools
import json
import pathlib
import shutil
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _repo  # noqa: E402,F401
from _results import RESULTS, record  # noqa: E402
import jax  # noqa: E402

from fp8jax.study.branches import branch, branch_engine, branch_memory  # noqa: E402
from fp8jax.train import compile_cache  # noqa: E402


def _timed(log: list, name: str, fn):
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    log.append((name, time.perf_counter() - t))
    return out
  return wrapper


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--train_workdir", required=True)
  ap.add_argument("--branch_out", required=True)
  ap.add_argument("--policies", default="attn_l0_e4m3,moe_l0_e4m3")
  ap.add_argument("--from_step", type=int, default=None)
  ap.add_argument("--k", type=int, default=8)
  ap.add_argument("--max_together", type=int, default=0)
  ap.add_argument("--keep_restored", action=argparse.BooleanOptionalAction, default=True)
  ap.add_argument("--tag", default="")
  ap.add_argument("--out", default="branch_groups.json")
  args = ap.parse_args()

  compile_cache.enable()  # $FP8JAX_COMPILE_CACHE, as the binaries
  log: list = []
  engine = branch_engine.Engine
  engine.restore = _timed(log, "restore", engine.restore)
  engine.run_group = _timed(log, "group_steps", engine.run_group)
  source = branch_memory.RestoredState
  source.take = _timed(log, "take", source.take)
  source.__init__ = _timed(log, "host_copy_init", source.__init__)

  shutil.rmtree(args.branch_out, ignore_errors=True)
  t = time.perf_counter()
  summary = branch.run(args.train_workdir, args.branch_out,
                       policies=[p for p in args.policies.split(",") if p],
                       from_steps=None if args.from_step is None else [args.from_step],
                       branches=branch.Branches(k=args.k),
                       max_together=args.max_together or None,
                       keep_restored=args.keep_restored)
  wall = time.perf_counter() - t
  stats = jax.devices()[0].memory_stats() or {}
  phases = {name: [round(s, 3) for n, s in log if n == name]
            for name in dict.fromkeys(n for n, _ in log)}
  steps = phases.get("group_steps", [])
  n_branches = len([p for p in args.policies.split(",") if p]) + 1  # and the noise branch
  spent = sum(sum(phases.get(n, [])) for n in ("restore", "group_steps"))  # takes: in groups
  record(args.tag or f"together{summary['together']}_keep{int(args.keep_restored)}",
         wall_s=wall, groups=summary["groups"], together=summary["together"],
         checkpoint_read_s=summary["checkpoint_read_s"], phases=phases, k=args.k,
         group_steps_s=sum(steps), group_step_s=sum(steps) / max(1, args.k * len(steps)),
         per_branch_step_s=spent / (args.k * n_branches),
         peak_gib=stats.get("peak_bytes_in_use", 0) / 2**30,
         bytes_limit_gib=stats.get("bytes_limit", 0) / 2**30)
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(args.out).write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
  main()
