"""Peak memory of the streaming training data pipeline and prepare_data's throughput.

Generates C4-like ``c4-train.NNNNN-of-MMMMM.json.gz`` shards (fields text, timestamp,
url; documents are slices of real English from the embedded corpus, 2.2 KB on average,
gzip level 6) of two total sizes, trains an 8K BPE tokenizer on a sample, then, each in
a child process:

* streams one whole epoch of each corpus through ``pipeline.make_batches("files", ...)``
  (2048-token rows, global batch 16) and reports the child's peak RSS
  (``getrusage(RUSAGE_SELF).ru_maxrss``) and RSS samples along the way;
* runs ``prepare_data`` on the smaller corpus with 1 and 2 worker processes and reports
  text MB/s of wall time and per CPU-second of the workers.

  .venv/bin/python scripts/measure_data_pipeline.py --work=/tmp/fp8jax_data_perf \
      --sizes_mb=200,2000 --out=out/data_pipeline.json

The corpora are deleted at the end unless ``--keep``.
"""

import argparse
import json
import multiprocessing
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import time
import zlib

import numpy as np

_CHILD_STREAM = r"""
import json, resource, sys, time
from fp8jax.data import pipeline, tokenizers
def rss_mb():
  for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
      return int(line.split()[1]) / 1024
tok = tokenizers.get_tokenizer(sys.argv[2])
base = rss_mb()
it = pipeline.make_batches("files", tok, seq_len=2048, global_batch=16, paths=(sys.argv[1],))
t0, c0, steps, samples = time.time(), time.process_time(), 0, []
while it.get_state()["epoch"] == 0:
  next(it)
  steps += 1
  if steps % 500 == 0:
    samples.append([steps, round(rss_mb(), 1)])
it.close()
print(json.dumps({"steps": steps, "tokens": steps * 16 * 2048, "seconds": time.time() - t0,
                  "cpu_seconds": time.process_time() - c0, "rss_after_imports_mb": base,
                  "rss_samples_mb": samples,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_CHILD_PREPARE = r"""
import json, os, resource, sys, time
from fp8jax.data import prepare
t0 = time.time()
with open(os.devnull, "w") as log:
  m = prepare.prepare([sys.argv[1]], sys.argv[2], sys.argv[3], workers=int(sys.argv[4]),
                      log=log)
wall = time.time() - t0
kids, me = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
cpu = kids.ru_utime + kids.ru_stime + me.ru_utime + me.ru_stime
print(json.dumps({"workers": int(sys.argv[4]), "text_bytes": m["text_bytes"],
                  "documents": m["documents"], "tokens": m["tokens"], "wall_seconds": wall,
                  "cpu_seconds": cpu, "text_mb_per_s": m["text_bytes"] / 1e6 / wall,
                  "text_mb_per_s_per_process": m["text_bytes"] / 1e6 / wall / int(sys.argv[4]),
                  "text_mb_per_cpu_second": m["text_bytes"] / 1e6 / cpu}))
"""


def write_shard(path: pathlib.Path, mb: float, seed: int) -> None:
  """One C4-like json.gz shard of about ``mb`` MB (compressed)."""
  from pydoc_data.topics import topics  # pylint: disable=import-outside-toplevel

  text = " ".join(topics[k] for k in sorted(topics))
  rng = np.random.default_rng(seed)
  comp = zlib.compressobj(6, zlib.DEFLATED, 31)  # gzip container
  with open(path, "wb") as f:
    written, i = 0, 0
    while written < mb * 1e6:
      lines = []
      for _ in range(2000):
        size = int(min(rng.lognormal(7.3, 0.8), 50_000))
        a = int(rng.integers(0, len(text) - size))
        lines.append(json.dumps({"text": text[a:a + size], "timestamp":
                                 "2019-04-25T12:57:54Z", "url":
                                 f"https://example.com/{seed}/{i}"}) + "\n")
        i += 1
      data = comp.compress("".join(lines).encode())
      f.write(data)
      written += len(data)
    f.write(comp.flush())


def write_corpus(folder: pathlib.Path, total_mb: float, shard_mb: float = 64) -> int:
  """C4-like json.gz shards of about ``total_mb`` MB (compressed) in all, written by one
  process per CPU core; returns their total size in bytes."""
  n = max(1, round(total_mb / shard_mb))
  folder.mkdir(parents=True, exist_ok=True)
  jobs = [(folder / f"c4-train.{s:05d}-of-{n:05d}.json.gz", total_mb / n, s) for s in range(n)]
  with multiprocessing.get_context("spawn").Pool(os.cpu_count()) as pool:
    pool.starmap(write_shard, jobs)
  return sum(p.stat().st_size for p in folder.iterdir())


def child(code: str, *args) -> dict:
  out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                       text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--work", default="/tmp/fp8jax_data_perf")
  ap.add_argument("--sizes_mb", default="200,2000")
  ap.add_argument("--out", default="")
  ap.add_argument("--keep", action="store_true")
  args = ap.parse_args()
  work = pathlib.Path(args.work)
  sizes = [float(s) for s in args.sizes_mb.split(",")]
  result = {"machine": {"cpus": os.cpu_count(), "load_avg_start": os.getloadavg()},
            "corpora": {}, "stream": {}, "prepare": []}
  try:
    for mb in sizes:
      t0 = time.time()
      size = write_corpus(work / f"c4_{int(mb)}mb", mb)
      result["corpora"][f"{int(mb)}mb"] = {"bytes": size, "shards": len(list(
          (work / f"c4_{int(mb)}mb").iterdir())), "generate_seconds": time.time() - t0}
      print(f"corpus {mb} MB: {size / 1e6:.0f} MB json.gz", flush=True)
    small = work / f"c4_{int(sizes[0])}mb"
    from fp8jax.data import bpe  # pylint: disable=import-outside-toplevel

    t0 = time.time()
    with open(os.devnull, "w") as log:
      bpe.train_bpe([str(small)], work / "tok8k", vocab_size=8192, sample_bytes=50 * 10**6,
                    log=log)
    result["tokenizer_train_seconds_50mb"] = time.time() - t0
    tok = str(work / "tok8k" / "tokenizer.json")
    for mb in sizes:
      r = child(_CHILD_STREAM, work / f"c4_{int(mb)}mb" / "*.json.gz", tok)
      result["stream"][f"{int(mb)}mb"] = r
      print(f"stream {mb} MB: peak RSS {r['peak_rss_mb']:.0f} MB, {r['steps']} steps in "
            f"{r['seconds']:.0f} s", flush=True)
    for workers in (1, 2):
      shutil.rmtree(work / "prep", ignore_errors=True)
      r = child(_CHILD_PREPARE, small, work / "prep", tok, workers)
      result["prepare"].append(r)
      print(f"prepare, {workers} workers: {r['text_mb_per_s']:.1f} MB/s of text "
            f"({r['text_mb_per_cpu_second']:.1f} per CPU-second)", flush=True)
    result["machine"]["load_avg_end"] = os.getloadavg()
    result["peak_rss_children_mb"] = resource.getrusage(
        resource.RUSAGE_CHILDREN).ru_maxrss / 1024
  finally:
    if not args.keep:
      shutil.rmtree(work, ignore_errors=True)
  text = json.dumps(result, indent=2)
  print(text)
  if args.out:
    pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
  main()
