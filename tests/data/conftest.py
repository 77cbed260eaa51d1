"""Fixtures of the data tests: a small tokenizer trained by ``fp8jax.data.bpe`` (the BPE
tests and those of its fast encoder)."""

import json
import os

import pytest

from fp8jax.data import bpe, sources


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A 600-id tokenizer learnt from the embedded corpus written as jsonl shards."""
  folder = tmp_path_factory.mktemp("corpus")
  docs = sources.embedded_corpus()
  for i in range(4):
    (folder / f"part-{i}.jsonl").write_text(
        "\n".join(json.dumps({"text": d}) for d in docs[i::4]) + "\n")
  out = tmp_path_factory.mktemp("tok")
  with open(os.devnull, "w") as log:
    meta = bpe.train_bpe([str(folder)], out, vocab_size=600, sample_bytes=200_000, log=log)
  return out, meta
