"""Each GPU kernel of a profile beside the bytes its HLO instruction moves: achieved GB/s.

    python scripts/bench/fusion_bytes.py TRACE.json.gz DUMP_DIR [--steps=3] [--top=40]

TRACE is a perfetto trace written by ``profile_step.py`` (with ``$OUT`` set); DUMP_DIR an
XLA dump of the same run (``XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text``), of
which the ``*after_optimizations.txt`` modules are read. A kernel is matched to the HLO
instruction of the same name ('.' written '_', as the profiler names XLA's kernels), or to
all the instructions that share its kernel (their ``deduplicated_name``); the bytes are the
sizes of their operands and results (an upper bound on what they read, since a fusion may
read a slice). Prints, per kernel, the milliseconds per step,
the bytes, the GB/s they imply and the source line JAX recorded, so that the fusions far
below the card's bandwidth stand out.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib
import re

BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
         "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "f4e2m1fn": 0.5}
SHAPE = re.compile(r"\b([a-z]+[0-9]+[a-z0-9]*)\[([0-9,]*)\]")
INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")


def _bytes_of(text: str) -> float:
  """Sum of the sizes of the array shapes written in ``text`` (``f32[8,128]{1,0}`` ...)."""
  total = 0.0
  for dtype, dims in SHAPE.findall(text):
    size = BYTES.get(dtype, 1 if dtype.startswith("f8") else None)
    if size is None:
      continue
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    total += n * size
  return total


def _key(name: str) -> str:
  """An HLO instruction name as the profiler names its kernel ('.' and '-' as '_')."""
  return name.replace(".", "_").replace("-", "_")


def _frames(text: str):
  """The module's stack-frame table: {frame id: (file, line, parent id)}."""
  def section(name):
    m = re.search(rf"^{name}\n((?:\d+ .*\n)+)", text, re.M)
    return [] if not m else [ln.split(" ", 1) for ln in m.group(1).splitlines()]
  files = {i: v.strip('"') for i, v in section("FileNames")}
  locs = {}
  for i, v in section("FileLocations"):
    f, ln = re.search(r"file_name_id=(\d+)", v), re.search(r"\bline=(\d+)", v)
    locs[i] = (files.get(f.group(1), "?"), ln.group(1) if ln else "?")
  frames = {}
  for i, v in section("StackFrames"):
    loc, parent = re.search(r"file_location_id=(\d+) parent_frame_id=(\d+)", v).groups()
    frames[i] = (*locs.get(loc, ("?", "?")), parent)
  return frames


def _source(frames, frame_id: str | None, depth: int = 3) -> str:
  """The innermost ``depth`` frames of the project's own files, innermost first."""
  out, seen = [], set()
  while frame_id and frame_id in frames and frame_id not in seen:
    seen.add(frame_id)
    file, line, parent = frames[frame_id]
    if re.search(r"fp8jax/|models/|scripts/", file) and "site-packages" not in file:
      out.append(f"{pathlib.Path(file).name}:{line}")
    frame_id = parent if parent != frame_id else None
  return " < ".join(out[:depth])


def instructions(dump: pathlib.Path) -> dict[str, dict[str, dict]]:
  """{module: {kernel name: {bytes, instances, op, source, op_name}}} over the dump's
  optimized modules; alike fusions that share a kernel share one record.

  Bytes: the instruction's result shapes plus its operands' (looked up by name in the
  module, where HLO names are unique)."""
  out = {}
  for path in sorted(dump.glob("*after_optimizations.txt")):
    text = path.read_text()
    mod = out.setdefault(path.name, {})
    frames = _frames(text)
    parsed = []
    sizes = {}
    for line in text.splitlines():
      m = INSTR.match(line)
      if not m:
        continue
      name, rhs = m.groups()
      opm = re.search(r"\s([a-z\-]+)\(", rhs)
      if not opm:
        continue
      sizes[name] = _bytes_of(rhs[:opm.start()])
      operands = re.findall(r"%([\w.\-]+)", rhs[opm.end():].split("), ")[0])
      parsed.append((name, opm.group(1), operands, rhs))
    for name, op, operands, rhs in parsed:
      if op in ("parameter", "constant", "get-tuple-element", "tuple", "bitcast"):
        continue
      frame = re.search(r"stack_frame_id=(\d+)", rhs)
      op_name = re.search(r'op_name="([^"]+)"', rhs)
      # Alike fusions share one kernel, named after the first (its deduplicated_name):
      # the profile's time for that name covers all of them, and so do the bytes here.
      # Each instruction's own name and its group's point to the same record.
      dedup = re.search(r'deduplicated_name="([^"]+)"', rhs)
      info = mod.setdefault(_key(dedup.group(1) if dedup else name), {
          "bytes": 0.0, "instances": 0, "op": op,
          "source": _source(frames, frame.group(1) if frame else None),
          "op_name": op_name.group(1)[-80:] if op_name else ""})
      mod[_key(name)] = info
      info["bytes"] += sizes[name] + sum(sizes.get(o, 0.0) for o in operands)
      info["instances"] += 1
  return out


def kernel_ms(trace: pathlib.Path) -> collections.Counter:
  """{kernel name: total milliseconds} over the GPU events of a perfetto trace."""
  events = json.loads(gzip.open(trace).read())
  events = events.get("traceEvents", events)
  gpu = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
         and "gpu" in str(e.get("args", {}).get("name", "")).lower()}
  out = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in gpu and "dur" in e:
      out[e["name"]] += float(e["dur"]) / 1e3
  return out


def best_module(ms: collections.Counter, modules: dict[str, dict]) -> str:
  """The module whose instruction names cover the most of the trace's kernel time."""
  def cover(mod):
    return sum(t for k, t in ms.items() if _key(k) in mod)
  return max(modules, key=lambda m: cover(modules[m]))


def table(ms: collections.Counter, instrs: dict[str, dict], steps: int, top: int) -> list:
  """The ``top`` kernels by time, with the bytes of their instructions in ``instrs``."""
  rows = []
  for name, t in ms.most_common(top):
    info = instrs.get(_key(name), {})
    per = t / steps
    b = info.get("bytes")
    rows.append({"kernel": name[:60], "ms_per_step": round(per, 3),
                 "instances": info.get("instances"),
                 "mib": round(b / 2**20, 1) if b else None,
                 "gb_per_s": round(b / (per / 1e3) / 1e9) if b else None,
                 "source": info.get("source", ""), "op_name": info.get("op_name", "")})
  return rows


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("trace", type=pathlib.Path)
  ap.add_argument("dump", type=pathlib.Path)
  ap.add_argument("--steps", type=int, default=3, help="steps the trace holds")
  ap.add_argument("--top", type=int, default=40)
  ap.add_argument("--json", type=pathlib.Path, help="also write the rows here")
  args = ap.parse_args()
  ms, modules = kernel_ms(args.trace), instructions(args.dump)
  module = best_module(ms, modules)
  print(f"module {module}; {sum(ms.values()) / args.steps:.1f} ms of kernels per step")
  rows = table(ms, modules[module], args.steps, args.top)
  print(f"{'ms/step':>8} {'MiB':>8} {'GB/s':>6} {'n':>3}  kernel  [source]  op_name")
  for r in rows:
    print(f"{r['ms_per_step']:8.3f} {r['mib'] or 0:8.1f} {r['gb_per_s'] or 0:6} "
          f"{r['instances'] or 0:3}  {r['kernel']}  [{r['source']}]  {r['op_name']}")
  if args.json:
    args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
