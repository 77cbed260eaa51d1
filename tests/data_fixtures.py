"""Small corpora in the layouts researchers hold, built by the tests themselves."""

from __future__ import annotations

import gzip
import json
import pathlib

import numpy as np

from fp8jax.data import tokenizers

TOK = tokenizers.ByteTokenizer()


def c4_docs(shard: int, n: int) -> list[str]:
  """Distinct documents of many lengths, non-ASCII too (an empty one per shard)."""
  docs = [f"<{shard}.{i}>" + "naïve ü " * (i % 4) + "x" * (7 * i % 23) for i in range(n)]
  docs[3] = ""
  return docs


def write_c4(folder: pathlib.Path, shards_n: int = 5, docs_n: int = 37) -> dict[str, list]:
  """allenai/c4-style shards: c4-train.NNNNN-of-MMMMM.json.gz, fields text/timestamp/url."""
  folder.mkdir(parents=True, exist_ok=True)
  out = {}
  for s in range(shards_n):
    docs = c4_docs(s, docs_n)
    name = f"c4-train.{s:05d}-of-{shards_n:05d}.json.gz"
    lines = [json.dumps({"text": d, "timestamp": "2019-04-25T12:57:54Z",
                         "url": f"https://example.com/{s}/{i}"}) for i, d in enumerate(docs)]
    with gzip.open(folder / name, "wt", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
    out[name] = docs
  return out


def take(it, steps):
  """int32 [steps, rows, seq_len]: the next ``steps`` batches."""
  batches = [next(it) for _ in range(steps)]
  return np.stack(batches) if batches else np.zeros((0,), np.int32)


def docs_of(batches) -> list[str]:
  """The documents packed in byte-token batches (EOS-separated), in order."""
  flat = batches.ravel()
  return TOK.decode(np.where(flat == TOK.eos_id, ord("|"), flat)).split("|")
