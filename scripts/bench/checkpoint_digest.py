"""Cost of the checkpoint digests: a training checkpoint saved with and without them.

    python scripts/bench/checkpoint_digest.py --config=tiny                     # CPU or GPU
    python scripts/bench/checkpoint_digest.py --config=2b --reps=3 --dir=/fast/disk  # GPU

Builds the training state of a run config (``experiments/configs/train_tiny.py`` or
``train_2b_c4.py``: params and AdamW state, float32) on the default device, then times
``Checkpointer.save`` + ``wait`` (the whole save, until the checkpoint is committed on
disk) into a fresh folder under ``--dir``, alternating saves with and without digests
after one warm-up save of each, and the digests alone (``checkpoint_digest.record``, what a save
adds: the device pass, the transfer of the results to the host and the paths; its first
call, which traces and compiles, is reported apart). The overhead is given as the ratio of
the medians and as the median of the differences within each with/without pair. Each
saved checkpoint is deleted before the next. With ``$OUT`` set, writes
``$OUT/checkpoint_digest.json``. Runs from a plain checkout (no pip install).
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _repo  # noqa: E402,F401
from _results import RESULTS, record  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from fp8jax.experiments.configs import train_2b_c4, train_tiny  # noqa: E402
from fp8jax.train import (  # noqa: E402
  checkpoint,
  checkpoint_digest,  # noqa: E402
  optim,
  run_config,
)
from fp8jax.train import step as step_lib  # noqa: E402

CONFIGS = {"tiny": train_tiny.get_config, "2b": train_2b_c4.get_config}


def build_state(name: str):
  cfg = CONFIGS[name]()
  model = run_config.model(cfg)
  tx = optim.optimizer(run_config.optim_config(cfg))
  init = jax.jit(lambda: step_lib.init_state(model.init(jax.random.key(0)), tx))
  return jax.block_until_ready(init())


def time_save(state, folder: pathlib.Path, digests: bool) -> float:
  """Seconds of one save (until committed) into an empty ``folder``, then deleted."""
  ckpt = checkpoint.Checkpointer(folder, save_every=1, digests=digests)
  t = time.perf_counter()
  ckpt.save(0, state, {"epoch": 0}, {"bench": "checkpoint_digest"}, force=True)
  ckpt.wait()
  seconds = time.perf_counter() - t
  ckpt.close()
  shutil.rmtree(folder)
  return seconds


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
  ap.add_argument("--reps", type=int, default=5, help="timed saves of each kind")
  ap.add_argument("--dir", default=None, help="folder for the saves (default: a temp dir)")
  args = ap.parse_args()
  base = pathlib.Path(tempfile.mkdtemp(prefix="ckpt_digest_", dir=args.dir))
  state = build_state(args.config)
  leaves = jax.tree.leaves(state)
  nbytes = sum(x.size * x.dtype.itemsize for x in leaves)
  print(f"{args.config}: {len(leaves)} arrays, {nbytes / 1e9:.3f} GB on "
        f"{jax.devices()[0].device_kind}; saving under {base}", flush=True)

  t = time.perf_counter()
  checkpoint_digest.record(state)
  compile_s = time.perf_counter() - t  # first call: trace, compile and run
  digest = []
  for _ in range(max(args.reps, 5)):
    t = time.perf_counter()
    checkpoint_digest.record(state)
    digest.append(time.perf_counter() - t)

  times = {True: [], False: []}
  for i in range(args.reps + 1):  # the first pair is the warm-up
    for digests in (False, True) if i % 2 == 0 else (True, False):
      seconds = time_save(state, base / f"save_{i}_{int(digests)}", digests)
      if i:
        times[digests].append(seconds)
  shutil.rmtree(base, ignore_errors=True)
  with_s, without_s = statistics.median(times[True]), statistics.median(times[False])
  paired_s = statistics.median(a - b for a, b in zip(times[True], times[False]))
  digest_s = statistics.median(digest)
  record(f"checkpoint_digest_{args.config}", device=jax.devices()[0].device_kind,
         arrays=len(leaves), state_gb=nbytes / 1e9, reps=args.reps,
         save_without_s=without_s, save_with_s=with_s, digest_s=digest_s,
         digest_first_call_s=compile_s, overhead=with_s / without_s - 1,
         paired_overhead=paired_s / without_s,
         digest_share=digest_s / without_s, digest_gbps=nbytes / digest_s / 1e9,
         times={"without": times[False], "with": times[True], "digest": digest})
  print(f"median save {without_s:.4f} s without digests, {with_s:.4f} s with: "
        f"{100 * (with_s / without_s - 1):+.2f}% (median of the paired differences: "
        f"{100 * paired_s / without_s:+.2f}%); the digests alone {digest_s * 1e3:.2f} ms = "
        f"{100 * digest_s / without_s:.2f}% of a save (spread of saves without digests: "
        f"{min(times[False]):.4f}-{max(times[False]):.4f} s)")
  out = os.environ.get("OUT")
  if out:
    path = pathlib.Path(out, "checkpoint_digest.json")
    path.write_text(json.dumps({"config": args.config, "jax": jax.__version__,
                                "numpy": np.__version__, "results": RESULTS}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
  main()
