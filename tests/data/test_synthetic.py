"""The generated corpus: deterministic, the structure it claims, a data source like the others."""

import collections
import math

import numpy as np
import pytest

from fp8jax.data import pipeline, synthetic, tokenizers


def test_corpus_is_deterministic_sized_and_made_of_its_words():
  a, b = synthetic.corpus(0.2), synthetic.corpus(0.2)
  assert a == b and a != synthetic.corpus(0.2, seed=1)
  size = sum(len(d) + 1 for d in a) / 1e6
  assert 0.1 < size < 0.3
  words = set(synthetic.chain()[0])
  assert all(len(d.split(" ")) == 256 and set(d.split(" ")) <= words for d in a[:20])


def test_entropy_rate_matches_the_empirical_bigram_entropy():
  words, succ, _, _ = synthetic.chain()
  docs = synthetic.corpus(3.0)
  pairs, firsts = collections.Counter(), collections.Counter()
  for d in docs:
    w = d.split(" ")
    pairs.update(zip(w[:-1], w[1:]))
    firsts.update(w[:-1])
  n = sum(pairs.values())
  # H(next | current) of the observed pairs, in bits (plug-in estimate, independent of the
  # chain's tables).
  h = -sum(c / n * math.log2(c / firsts[a]) for (a, _), c in pairs.items())
  assert h == pytest.approx(synthetic.entropy_bits(), rel=0.03)
  index = {w: i for i, w in enumerate(words)}
  a, b = next(iter(pairs))
  assert index[b] in succ[index[a]]


def test_synthetic_source_batches_do_not_repeat_and_errors_are_named():
  tok = tokenizers.get_tokenizer("bytes")
  it = pipeline.make_batches("synthetic:0.5", tok, seq_len=64, global_batch=8)
  seqs = np.concatenate([next(it) for _ in range(100)])
  assert len({s.tobytes() for s in seqs}) == len(seqs)
  assert it.get_state()["data"].startswith("synthetic:")
  assert pipeline.describe("synthetic:0.5", tok) != pipeline.describe("synthetic:1", tok)
  with pytest.raises(ValueError, match="number of megabytes"):
    pipeline.make_batches("synthetic:lots", tok, seq_len=64, global_batch=8)
