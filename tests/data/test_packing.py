"""fp8jax.data.packing: documents packed into sequences with EOS after each, in tokenizer
chunks, and the deterministic, sharded, resumable batch iterator over them."""

import json

import numpy as np
import pytest

from fp8jax.data import packing, tokenizers
from tests.data.test_packed_cache import _docs


def test_pack_in_chunks_equals_tokenizing_each_document(monkeypatch):
  tok = tokenizers.get_tokenizer("bytes")
  docs = _docs()
  eos = [tok.eos_id]
  want = np.concatenate([np.concatenate([tok.encode(d), eos]) for d in docs])
  monkeypatch.setattr(packing, "_CHUNK", 7)  # chunks that end mid-list
  got = packing.pack(docs, tok, 16)
  n = len(want) // 16
  np.testing.assert_array_equal(got, want[: n * 16].reshape(n, 16))


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
