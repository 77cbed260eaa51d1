"""fp8jax.data.fast_bpe: the exact fast encoder of byte-level BPE tokenizers of
``fp8jax.data.bpe``'s design, against ``tokenizers`` itself (the tokenizer: the ``trained``
fixture of ``tests/data/conftest.py``)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
import numpy as np
import pytest

from fp8jax.data import fast_bpe, sources, tokenizers

pytest.importorskip("tokenizers", reason="the BPE tokenizer needs tokenizers (data extra)")


ALPHABET = list("abcXYZ0129 .,'!-\t\n\r\x0b\x0c_") + [
    "é", "ü", "中", "😀", "\u00a0", "\u2028", "\u3000", "\x00", "\x1f", "\x7f", "  ", "\n\n",
    " the", "<|endoftext|>", "<|pad|>", "<|"]


@given(st.lists(st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join), max_size=12))
def test_fast_encoder_equals_tokenizers(trained, texts):
  path = str(trained[0] / "tokenizer.json")
  fast, slow = _pair(path)
  got, want = fast.encode_batch(texts), slow.encode_batch(texts)
  for text, g, w in zip(texts, got, want):
    np.testing.assert_array_equal(g, w, err_msg=repr(text))
    assert g.dtype == np.int32


_PAIRS = {}


def _pair(path):
  if path not in _PAIRS:
    _PAIRS[path] = (tokenizers.HFTokenizer(path), tokenizers.HFTokenizer(path, fast=False))
  return _PAIRS[path]


def test_fast_encoder_on_real_text_and_its_word_table(trained):
  fast, slow = _pair(str(trained[0] / "tokenizer.json"))
  assert fast._fast is not None and slow._fast is None
  docs = sources.embedded_corpus()
  chunks = [d[i:i + 3000] for d in docs for i in range(0, len(d), 3000)] + ["", " ", "x" * 40]
  for start in range(0, len(chunks), 64):  # the table grows and merges between batches
    batch = chunks[start:start + 64]
    for g, w in zip(fast.encode_batch(batch), slow.encode_batch(batch)):
      np.testing.assert_array_equal(g, w)
  assert len(fast._fast._entries[0]) > 1000 and fast._fast._probes >= 1
  assert fast.encode(docs[0]).tolist() == slow.encode(docs[0]).tolist()
  # A tokenizer of another design is not taken for this one.
  j = json.loads((trained[0] / "tokenizer.json").read_text())
  assert fast_bpe.supports(json.dumps(j))
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+"
  assert not fast_bpe.supports(json.dumps(j))
  j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
  assert not fast_bpe.supports(json.dumps(j))
