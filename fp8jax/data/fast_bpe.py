"""Exact, fast encoding for tokenizers of :mod:`fp8jax.data.bpe`'s design.

The tokenizer's pre-tokens depend only on ASCII classes of bytes (letter, digit,
punctuation, whitespace), so a batch of documents is split into pre-tokens with array
operations on its UTF-8 bytes. Every pre-token is a word whose BPE encoding does not
depend on its neighbours: words of up to 15 bytes are looked up in a hash table keyed by
their bytes (exact keys: a hash collision cannot alias two words), longer ones in a dict;
words not yet seen are encoded by ``tokenizers`` itself and added (up to ``max_words``).
Documents that contain a special token's text go to ``tokenizers`` whole. The result
equals ``tokenizers``' ``encode(text, add_special_tokens=False)``; the tests check it on
random and real text.
"""

from __future__ import annotations

import json
import threading

import numpy as np

from fp8jax.data import bpe

_CLASS = np.zeros(256, np.uint8)  # 0 letter (and every non-ASCII byte), 1 digit, 2 punct
_CLASS[np.frombuffer(b"0123456789", np.uint8)] = 1
_CLASS[[c for c in range(0x21, 0x7F) if not chr(c).isalnum()]] = 2
_CLASS[np.frombuffer(bpe.WHITESPACE.encode(), np.uint8)] = 3
_M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)
# Byte masks of a word's first L bytes (L = 0..16) in the low and high 8-byte halves.
_LO = np.asarray([(1 << (8 * min(n, 8))) - 1 for n in range(17)], np.uint64)
_HI = np.asarray([(1 << (8 * min(max(n - 8, 0), 8))) - 1 for n in range(17)], np.uint64)


def supports(tokenizer_json: str) -> bool:
  """Whether a ``tokenizer.json`` (its text) has the design this encoder reproduces."""
  j = json.loads(tokenizer_json)
  pre, model = j.get("pre_tokenizer") or {}, j.get("model") or {}
  parts = pre.get("pretokenizers") or [{}, {}]
  return (pre.get("type") == "Sequence" and len(parts) == 2 and j.get("normalizer") is None
          and parts[0] == {"type": "Split", "pattern": {"Regex": bpe.PATTERN},
                           "behavior": "Isolated", "invert": False}
          and parts[1].get("type") == "ByteLevel" and parts[1].get("use_regex") is False
          and parts[1].get("add_prefix_space") is False and model.get("type") == "BPE"
          and not model.get("dropout") and not model.get("continuing_subword_prefix")
          and not model.get("end_of_word_suffix") and not model.get("byte_fallback"))


def pretokenize(buf: np.ndarray, lens: np.ndarray) -> np.ndarray:
  """Start offsets (int64) of the pre-tokens of documents whose UTF-8 bytes ``buf``
  (uint8) holds back to back, ``lens`` bytes each; a document starts a pre-token."""
  n = len(buf)
  if n == 0:
    return np.zeros(0, np.int64)
  first = np.zeros(n + 1, bool)
  first[(np.cumsum(lens) - lens)[lens > 0]] = True
  c = _CLASS[buf]
  starts = first[:n].copy()
  starts[1:] |= c[1:] != c[:-1]
  # The last whitespace before a non-whitespace byte stands apart: alone, or as the
  # leading space of the next pre-token when it is a space.
  starts[:-1] |= (c[:-1] == 3) & (c[1:] != 3) & ~first[1:n]
  starts[1:] &= ~((c[1:] != 3) & (buf[:-1] == 0x20) & ~first[1:n])
  return np.flatnonzero(starts)


class FastEncoder:
  """``encode_batch(texts) -> list of int32 arrays``, equal to ``tok``'s encodings.

  Args:
    tok: a ``tokenizers.Tokenizer`` for which :func:`supports` holds.
    max_words: words kept in the table (about 50 bytes each).
  """

  def __init__(self, tok, max_words: int = 1 << 20):
    self._tok, self.max_words = tok, max_words
    self._specials = [t.content for t in tok.get_added_tokens_decoder().values()]
    self._store = np.zeros(1 << 16, np.int32)  # token ids of the known words, back to back
    self._size = 0
    # The known words (columns: key hash, low and high key halves, store offset, token
    # count) and their open-addressing table (see _rebuild).
    self._entries = [np.zeros(0, np.uint64)] * 3 + [np.zeros(0, np.int64)] * 2
    self._slots = np.zeros((1, 3), np.uint64)
    self._bits, self._probes = 0, 0
    self._pending = []
    self._long = {}  # bytes -> (offset, length) for words over 15 bytes
    self._lock = threading.Lock()

  def _append(self, ids: np.ndarray) -> int:
    end = self._size + len(ids)
    if end > len(self._store):
      self._store = np.resize(self._store, max(end, 2 * len(self._store)))
    self._store[self._size:end] = ids
    self._size = end
    return end - len(ids)

  def _hf(self, texts) -> list[np.ndarray]:
    encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
    return [np.asarray(e.ids, np.int32) for e in encode(list(texts), add_special_tokens=False)]

  def encode_batch(self, texts) -> list[np.ndarray]:
    with self._lock:  # the tables are shared by reading threads
      return self._encode_batch(list(texts))

  def _encode_batch(self, texts) -> list[np.ndarray]:
    out = [None] * len(texts)
    joined = "".join(texts)
    if any(s in joined for s in self._specials):
      slow = [i for i, t in enumerate(texts) if any(s in t for s in self._specials)]
      for i, ids in zip(slow, self._hf([texts[i] for i in slow])):
        out[i] = ids
      fast = [i for i in range(len(texts)) if out[i] is None]
      texts = [texts[i] for i in fast]
      joined = "".join(texts)
    else:
      fast = range(len(texts))
    for i, ids in zip(fast, self._encode(texts, joined)):
      out[i] = ids
    return out

  def _encode(self, texts, joined: str) -> list[np.ndarray]:
    lens = np.fromiter((len(t) if t.isascii() else len(t.encode("utf-8")) for t in texts),
                       np.int64, len(texts))
    buf = np.frombuffer(joined.encode("utf-8"), np.uint8)
    n = len(buf)
    s = pretokenize(buf, lens)
    length = np.diff(s, append=n)
    padded = np.zeros(n + 16, np.uint8)
    padded[:n] = buf
    key = np.lib.stride_tricks.as_strided(padded, (max(n, 1), 16), (1, 1))[s].view(np.uint64)
    clipped = np.minimum(length, 16)
    lo = key[:, 0] & _LO[clipped]
    hi = (key[:, 1] & _HI[clipped]) | (length.astype(np.uint64) << np.uint64(56))
    h = (lo * _M1) ^ (hi * _M2)
    short = length <= 15
    off, cnt = self._lookup(h, lo, hi, short)
    miss = np.flatnonzero(cnt < 0)
    if len(miss):
      self._fill(miss, s, length, h, lo, hi, short, buf, off, cnt)
    total = int(cnt.sum())
    first = np.cumsum(cnt) - cnt
    ids = self._store[np.repeat(off - first, cnt) + np.arange(total)]
    bounds = np.append(first, total)[np.searchsorted(s, np.cumsum(lens) - lens)]
    return np.split(ids, bounds[1:])

  def _lookup(self, h, lo, hi, short):
    """(store offset, token count or -1 if unknown) of each word: linear probing in the
    open-addressing table from the slot the key hash's top bits name (words over 15 bytes
    are never in it)."""
    mask = len(self._slots) - 1
    home = (h >> np.uint64(64 - self._bits)).astype(np.int64) & mask
    row = self._slots[home]  # [m, 3]: lo, hi (0: empty), offset << 8 | count
    found = (row[:, 1] == hi) & (row[:, 0] == lo)
    packed = row[:, 2].view(np.int64)
    off, cnt = np.where(found, packed >> 8, 0), np.where(found, packed & 255, -1)
    idx = np.flatnonzero(~found & (row[:, 1] != 0) & short)  # a taken slot: probe on
    home = home[idx]
    for probe in range(1, self._probes):
      if not len(idx):
        break
      row = self._slots[(home + probe) & mask]
      found = (row[:, 1] == hi[idx]) & (row[:, 0] == lo[idx])
      packed = row[found, 2].view(np.int64)
      off[idx[found]], cnt[idx[found]] = packed >> 8, packed & 255
      more = (row[:, 1] != 0) & ~found
      idx, home = idx[more], home[more]
    return off, cnt

  def _fill(self, miss, s, length, h, lo, hi, short, buf, off, cnt) -> None:
    """Encodes the unknown words at ``miss`` (with ``tokenizers``), sets their offsets and
    counts, and remembers them."""
    short_miss, long_miss = miss[short[miss]], miss[~short[miss]]
    pairs = np.stack([lo[short_miss], hi[short_miss]], 1).view("V16").ravel()
    _, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
    reps = short_miss[first]
    words = [bytes(buf[s[i]:s[i] + length[i]]) for i in reps]
    longs = [bytes(buf[s[i]:s[i] + length[i]]) for i in long_miss]
    new_long = sorted({w for w in longs if w not in self._long})
    encoded = self._hf([w.decode("utf-8") for w in words + new_long])
    starts = np.asarray([self._append(ids) for ids in encoded], np.int64)
    counts = np.asarray([len(ids) for ids in encoded], np.int64)
    off[short_miss], cnt[short_miss] = starts[:len(words)][inverse], counts[:len(words)][inverse]
    fresh = {w: (int(o), int(c)) for w, o, c in zip(new_long, starts[len(words):],
                                                   counts[len(words):])}
    for i, w in zip(long_miss, longs):
      off[i], cnt[i] = self._long.get(w) or fresh[w]
    if len(self._long) < self.max_words // 4:
      self._long.update(fresh)
    known = len(self._entries[0])
    if known + sum(len(p[0]) for p in self._pending) < self.max_words:
      self._pending.append((h[reps], lo[reps], hi[reps], starts[:len(words)],
                            counts[:len(words)]))
    if sum(len(p[0]) for p in self._pending) >= max(1024, known // 8):
      self._rebuild()

  def _rebuild(self) -> None:
    """Adds the pending words to the entries and rebuilds the hash table (at most a
    quarter full), placing the entries probe by probe: an entry at ``home + p`` found the
    slots ``home .. home + p - 1`` taken, so a lookup may stop at the first empty slot."""
    cols = [np.concatenate([e] + [p[k] for p in self._pending])
            for k, e in enumerate(self._entries)]
    pairs = np.stack([cols[1], cols[2]], 1).view("V16").ravel()
    _, keep = np.unique(pairs, return_index=True)  # a word missed twice before a rebuild
    self._entries, self._pending = [c[keep] for c in cols], []
    h, lo, hi, off, cnt = self._entries
    self._bits = max(10, int(4 * len(h) - 1).bit_length())  # at most a quarter full
    size = 1 << self._bits
    slots = np.zeros((size, 3), np.uint64)  # lo, hi (0: empty), offset << 8 | count
    todo = np.arange(len(h))
    home = (h >> np.uint64(64 - self._bits)).astype(np.int64)
    probe = 0
    while len(todo):
      slot = (home[todo] + probe) & (size - 1)
      free = slots[slot, 1] == 0
      _, first = np.unique(slot[free], return_index=True)
      won = np.flatnonzero(free)[first]
      e = todo[won]
      slots[slot[won]] = np.stack([lo[e], hi[e], ((off[e] << 8) | cnt[e]).astype(np.uint64)], 1)
      placed = np.zeros(len(todo), bool)
      placed[won] = True
      todo, probe = todo[~placed], probe + 1
    self._slots, self._probes = slots, probe
