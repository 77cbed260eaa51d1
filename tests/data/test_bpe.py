"""The byte-level BPE tokenizer: training on a corpus sample, its ids, and the vocabulary
check before compute (its fast encoder: ``tests/data/test_fast_bpe.py``; the ``trained``
fixture: ``tests/data/conftest.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fp8jax.data import bpe, pipeline, sources, tokenizers
from tests.data_fixtures import write_c4

pytest.importorskip("tokenizers", reason="the BPE tokenizer needs tokenizers (data extra)")


def test_training_writes_the_tokenizer_and_its_ids(trained):
  out, meta = trained
  assert meta["vocab_size"] == 600 and meta["requested_vocab_size"] == 600
  assert (meta["eos_token"], meta["eos_id"], meta["pad_token"], meta["pad_id"]) == (
      "<|endoftext|>", 0, "<|pad|>", 1)
  largest = max(len(d.encode()) for d in sources.embedded_corpus())
  assert 200_000 <= meta["sample"]["bytes"] < 200_000 + largest  # stops at the budget
  assert len(meta["sample"]["shards"]) >= 3  # spread over shards (~50 KB from each)
  assert json.loads((out / "tokenizer_meta.json").read_text()) == meta
  tok = tokenizers.get_tokenizer(str(out / "tokenizer.json"))
  assert (tok.vocab_size, tok.eos_id, tok.fingerprint) == (600, 0, meta["fingerprint"])
  text = "The FP8 study — naïve ünïcode, 1234 tokens.\n\n  Done"
  assert tok.decode(tok.encode(text)) == text
  assert len(tok.encode(text)) < len(text.encode())  # merges were learnt


@pytest.mark.slow
def test_binary_trains_with_the_vocabulary_flag(tmp_path):
  write_c4(tmp_path / "c4", shards_n=2, docs_n=200)
  run = subprocess.run([sys.executable, "-m", "fp8jax.experiments.train_tokenizer",
                        f"--input={tmp_path / 'c4' / '*.json.gz'}", f"--out={tmp_path / 'tok'}",
                        "--vocab_size=300", "--sample_mb=0.01"], capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  assert "EOS id 0, pad id 1" in run.stdout and "ETA" in run.stderr
  meta = json.loads((tmp_path / "tok" / "tokenizer_meta.json").read_text())
  assert meta["vocab_size"] <= 300 and meta["sample"]["bytes"] >= 10_000
  bad = subprocess.run([sys.executable, "-m", "fp8jax.experiments.train_tokenizer",
                        f"--input={tmp_path / 'nothing*.json.gz'}", f"--out={tmp_path / 't2'}"],
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2 and "error: no data shard matches" in bad.stderr
  assert "Traceback" not in bad.stderr


def test_vocabulary_mismatch_is_an_error_before_compute(trained, tmp_path):
  from fp8jax.train import loop, run_config

  tok = tokenizers.get_tokenizer(str(trained[0] / "tokenizer.json"))
  with pytest.raises(ValueError, match=r"needs 600 token ids \(vocab_size 600, eos_id 0\) but "
                     "the model's vocabulary has only 320"):
    pipeline.check_vocab(tok, 320)
  c = run_config.defaults()  # the tiny model: 320 ids
  c.optim.warmup_steps = 1
  c.data.tokenizer = str(trained[0] / "tokenizer.json")
  with pytest.raises(ValueError, match="needs 600 token ids"):
    loop.train(c, tmp_path)
  assert not (tmp_path / "checkpoints").exists()
  c.data.tokenizer = str(tmp_path / "missing.json")
  with pytest.raises(FileNotFoundError, match="no tokenizer file .*missing.json"):
    loop.train(c, tmp_path)
  with pytest.raises(ValueError, match="vocab_size 200 is below"):
    bpe.train_bpe([str(tmp_path)], tmp_path / "t", vocab_size=200)


def test_training_on_the_synthetic_corpus(tmp_path):
  """``synthetic:<MB>`` trains on the generated corpus (no shards): the sample is that
  corpus's first documents, and its words encode to fewer ids than bytes."""
  from fp8jax.data import synthetic  # pylint: disable=import-outside-toplevel

  with open(os.devnull, "w") as log:
    meta = bpe.train_bpe(["synthetic:0.2"], tmp_path, vocab_size=400, sample_bytes=100_000,
                         log=log)
  assert meta["sample"]["shards"] == ["synthetic:0.2"]
  assert 100_000 <= meta["sample"]["bytes"] < 100_000 + 4_000
  tok = tokenizers.get_tokenizer(str(tmp_path / "tokenizer.json"))
  doc = synthetic.corpus(0.2)[0]
  ids = tok.encode(doc)
  assert tok.decode(ids) == doc
  assert len(ids) < 0.7 * len(doc.encode())
  with pytest.raises(ValueError, match="synthetic:<MB>"):
    list(bpe.sample_documents(["synthetic:x"], 10))
