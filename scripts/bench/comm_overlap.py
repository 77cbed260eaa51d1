"""How much of each GPU's collective time a perfetto trace shows hidden behind compute.

    python scripts/bench/comm_overlap.py TRACE.json.gz [--steps=2]

For each GPU in the trace (a ``jax.profiler.trace(..., create_perfetto_trace=True)`` of
a multi-GPU step): the time of its NCCL kernels (``nccl`` in the name), the part of it
during which another kernel of the same GPU ran (hidden), the part that ran alone
(exposed), the compute kernels' busy time (their union), and the span from the first
kernel to the last. Milliseconds per step. A collective that XLA schedules asynchronously
but that waits for its operand shows up as exposed: the measure is what ran at the same
time, not what the schedule allowed.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib


def _union(intervals):
  """Sorted, merged [start, end) intervals."""
  merged = []
  for s, e in sorted(intervals):
    if merged and s <= merged[-1][1]:
      merged[-1][1] = max(merged[-1][1], e)
    else:
      merged.append([s, e])
  return merged


def _covered(interval, merged):
  """Length of ``interval`` covered by the merged intervals."""
  s, e = interval
  return sum(max(0.0, min(e, b) - max(s, a)) for a, b in merged if a < e and b > s)


def gpu_kernels(trace: pathlib.Path) -> dict[str, list[tuple[str, float, float]]]:
  """{GPU process name: [(kernel, start us, end us)]} from a perfetto trace."""
  events = json.loads(gzip.open(trace).read())
  events = events.get("traceEvents", events)
  names = {e["pid"]: str(e.get("args", {}).get("name", "")) for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  gpus = {pid: n for pid, n in names.items() if "gpu" in n.lower()}
  out = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in gpus and "dur" in e:
      t = float(e["ts"])
      out[gpus[e["pid"]]].append((e["name"], t, t + float(e["dur"])))
  return dict(out)


def overlap(kernels: list[tuple[str, float, float]], steps: int) -> dict[str, float]:
  """One GPU's collective and compute time, ms per step (see the module docstring)."""
  comm = [(s, e) for n, s, e in kernels if "nccl" in n.lower()]
  compute = _union((s, e) for n, s, e in kernels if "nccl" not in n.lower())
  comm_ms = sum(e - s for s, e in comm) / 1e3
  hidden = sum(_covered(c, compute) for c in comm) / 1e3
  span = (max(e for _, _, e in kernels) - min(s for _, s, _ in kernels)) / 1e3
  per = lambda v: round(v / steps, 3)  # noqa: E731
  return {"collective_ms": per(comm_ms), "hidden_ms": per(hidden),
          "exposed_ms": per(comm_ms - hidden),
          "compute_busy_ms": per(sum(e - s for s, e in compute) / 1e3),
          "span_ms": per(span), "collectives": len(comm) / steps}


def report(trace: pathlib.Path, steps: int) -> dict[str, dict[str, float]]:
  """{GPU: overlap(...)} for every GPU of the trace."""
  return {gpu: overlap(k, steps) for gpu, k in sorted(gpu_kernels(trace).items())}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("trace", type=pathlib.Path)
  ap.add_argument("--steps", type=int, default=2, help="steps the trace holds")
  args = ap.parse_args()
  for gpu, row in report(args.trace, args.steps).items():
    print(gpu, json.dumps(row))


if __name__ == "__main__":
  main()
