"""Data: embedded corpus, tokenizers, packing, the resumable sharded iterator."""

import json

import numpy as np
import pytest

from fp8jax.data import packing, sources, tokenizers


def test_embedded_corpus_is_real_english():
  docs = sources.embedded_corpus()
  text = " ".join(docs)
  assert len(docs) > 50 and len(text) > 300_000
  words = text.lower().split()
  assert words.count("the") > 0.02 * len(words)  # English prose, not code or noise


def test_text_and_jsonl_files_stream(tmp_path):
  (tmp_path / "a.txt").write_text("hello world\nsecond line\n")  # one document per line
  (tmp_path / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two"}\n')
  docs = sources.text_files([tmp_path / "a.txt", tmp_path / "b.jsonl"])
  assert next(docs) == "hello world"  # a generator: documents are read one at a time
  assert list(docs) == ["second line", "one", "two"]
  (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "x"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:2: no field 'text' \(has \['body'\]\)"):
    list(sources.text_files([tmp_path / "bad.jsonl"]))
  assert list(sources.text_files([tmp_path / "bad.jsonl"], skip_bad=True)) == ["ok"]
  with pytest.raises(FileNotFoundError, match="no data shard matches"):
    list(sources.text_files([tmp_path / "missing.txt"]))


def test_byte_tokenizer_round_trip():
  tok = tokenizers.ByteTokenizer()
  text = "FP8 — naïve ünïcode"
  ids = tok.encode(text)
  assert ids.max() < 256 and tok.vocab_size == 257
  assert tok.decode(np.concatenate([ids, [tok.eos_id]])) == text


def test_pack_keeps_every_token_in_order_with_eos():
  tok = tokenizers.ByteTokenizer()
  docs = ["abc", "de", "fghij"]
  packed = packing.pack(docs, tok, seq_len=4)
  stream = [97, 98, 99, 256, 100, 101, 256, 102, 103, 104, 105, 106, 256]
  np.testing.assert_array_equal(packed.ravel(), stream[:12])
  assert packed.shape == (3, 4) and packed.dtype == np.int32
  with pytest.raises(ValueError, match="fewer than one sequence"):
    packing.pack(["a"], tok, seq_len=8)


def test_iterator_is_deterministic_sharded_and_resumable():
  seqs = np.arange(40 * 3, dtype=np.int32).reshape(40, 3)
  def run(seed, steps, **kw):
    it = packing.BatchIterator(seqs, 8, seed=seed, **kw)
    return [next(it) for _ in range(steps)], it
  a, _ = run(0, 12)
  b, _ = run(0, 12)
  c, _ = run(1, 12)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))
  # An epoch (5 steps) visits every sequence once.
  assert sorted(np.concatenate(a[:5])[:, 0].tolist()) == list(range(0, 120, 3))
  # Two processes split each global batch.
  p0, _ = run(0, 12, process_index=0, process_count=2)
  p1, _ = run(0, 12, process_index=1, process_count=2)
  for full, x, y in zip(a, p0, p1):
    np.testing.assert_array_equal(np.concatenate([x, y]), full)
  # Resuming from a saved position continues identically.
  _, it = run(0, 7)
  state = json.loads(json.dumps(it.get_state()))
  fresh = packing.BatchIterator(seqs, 8, seed=0)
  fresh.set_state(state)
  for expected in a[7:]:
    np.testing.assert_array_equal(next(fresh), expected)
  with pytest.raises(ValueError, match="used seed 0, this run uses 3"):
    packing.BatchIterator(seqs, 8, seed=3).set_state(state)
  with pytest.raises(ValueError, match="not divisible by the 3 processes"):
    packing.BatchIterator(seqs, 8, process_count=3)
