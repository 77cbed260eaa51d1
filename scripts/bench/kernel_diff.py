"""Two traces' GPU kernel time side by side, by kind of kernel: where program B spends
more or less than program A (e.g. the layer loop against the scan over stacked params).

    python scripts/bench/kernel_diff.py A.json.gz B.json.gz --steps=2 [--labels=loop,scan]

Kernel names differ between two programs (``loop_add_fusion_12``), so kernels are grouped
by their name without its numbers (``loop_add_fusion``); the groups are printed by the
size of their difference, in ms per step, then each trace's longest kernels.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import fusion_bytes  # noqa: E402


def kind(name: str) -> str:
  """The kernel's name without its numbers and template arguments."""
  name = re.sub(r"<.*", "", name)
  name = re.sub(r"[._]?\d+", "", name)
  return name[:80]


def by_kind(ms: collections.Counter, steps: int) -> collections.Counter:
  out = collections.Counter()
  for name, t in ms.items():
    out[kind(name)] += t / steps
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("a")
  ap.add_argument("b")
  ap.add_argument("--steps", type=int, default=2)
  ap.add_argument("--labels", default="A,B")
  ap.add_argument("--top", type=int, default=40)
  args = ap.parse_args()
  la, lb = args.labels.split(",")
  ka, kb = (fusion_bytes.kernel_ms(pathlib.Path(p)) for p in (args.a, args.b))
  ga, gb = by_kind(ka, args.steps), by_kind(kb, args.steps)
  ta, tb = sum(ga.values()), sum(gb.values())
  print(f"device ms per step: {la} {ta:.2f}, {lb} {tb:.2f}, difference {tb - ta:+.2f}")
  print(f"{'kind':80s} {la:>9s} {lb:>9s} {'diff':>8s}  count {la}/{lb}")
  ca = collections.Counter(kind(n) for n in ka)
  cb = collections.Counter(kind(n) for n in kb)
  for k in sorted(set(ga) | set(gb), key=lambda k: -abs(gb[k] - ga[k]))[:args.top]:
    print(f"{k:80s} {ga[k]:9.3f} {gb[k]:9.3f} {gb[k] - ga[k]:+8.3f}  {ca[k]}/{cb[k]}")
  for label, ms in ((la, ka), (lb, kb)):
    print(f"\nlongest kernels of {label} (ms per step)")
    for name, t in ms.most_common(args.top):
      print(f"{t / args.steps:9.3f}  {name[:110]}")


if __name__ == "__main__":
  main()
