"""A generated corpus for long runs on small machines: text from a random word-bigram chain.

The embedded corpus (0.5 MB) is seen many times by a long run at 2B width, which then
memorizes it. ``synthetic:<MB>`` (the data source ``"synthetic:16"``) is about that many
megabytes of text that never repeats within a run of that size and has a known structure:
a vocabulary of ``vocab`` lowercase words (1-9 letters) and, for each word, ``branching``
successors drawn by global frequency (Zipf) with Zipf-weighted probabilities. Documents are
``doc_words`` words long, each chain started from the Zipf distribution. Everything is a
function of ``seed``: the same source gives the same corpus on every machine and process.

The best achievable loss is the chain's entropy rate, reported by :func:`entropy_bits`
(bits per word; per byte, divide by the mean word length + 1 for the space).
"""

from __future__ import annotations

import functools

import numpy as np

_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)


@functools.lru_cache(maxsize=4)
def chain(vocab: int = 4096, branching: int = 16, seed: int = 0):
  """(words list[str], successors int [V, B], cumulative probabilities float [V, B],
  start probabilities float [V])."""
  rng = np.random.default_rng([seed, 0])
  words, seen = [], set()
  while len(words) < vocab:
    n = int(min(9, 1 + rng.geometric(0.3)))
    w = _LETTERS[rng.integers(0, 26, n)].tobytes().decode()
    if w not in seen:
      seen.add(w)
      words.append(w)
  zipf = 1.0 / np.arange(1, vocab + 1)
  start = zipf / zipf.sum()
  succ = np.stack([rng.choice(vocab, branching, replace=False, p=start)
                   for _ in range(vocab)]).astype(np.int32)
  w = 1.0 / np.arange(1, branching + 1)
  probs = np.broadcast_to(w / w.sum(), (vocab, branching))
  return words, succ, np.cumsum(probs, axis=1), start


def corpus(megabytes: float, seed: int = 0, doc_words: int = 256) -> list[str]:
  """About ``megabytes`` MB of documents (space-separated words) from :func:`chain`."""
  if not megabytes > 0:
    raise ValueError(f"the synthetic corpus size must be > 0 MB, got {megabytes}")
  words, succ, cum, start = chain(seed=seed)
  mean_len = np.mean([len(w) + 1 for w in words])  # unweighted: only sizes the run
  n_docs = max(1, int(np.ceil(megabytes * 1e6 / mean_len / doc_words)))
  rng = np.random.default_rng([seed, 1])
  ids = np.empty((n_docs, doc_words), np.int32)
  ids[:, 0] = rng.choice(len(words), n_docs, p=start)
  for t in range(1, doc_words):
    u = rng.random(n_docs)
    j = np.minimum((u[:, None] > cum[ids[:, t - 1]]).sum(1), succ.shape[1] - 1)
    ids[:, t] = succ[ids[:, t - 1], j]
  table = np.array(words, dtype=object)
  return [" ".join(table[row]) for row in ids]


def entropy_bits(seed: int = 0, iters: int = 200) -> float:
  """The chain's entropy rate in bits per word: the successor entropy weighted by the
  stationary distribution (power iteration from the start distribution)."""
  words, succ, cum, start = chain(seed=seed)
  probs = np.diff(cum, axis=1, prepend=0.0)
  pi = start.copy()
  for _ in range(iters):
    nxt = np.zeros_like(pi)
    np.add.at(nxt, succ, pi[:, None] * probs)
    pi = nxt
  h = -np.sum(probs * np.log2(probs), axis=1)
  return float(pi @ h)
