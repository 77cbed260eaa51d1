"""fp8jax.data.tokenizers: the byte tokenizer, a ``tokenizer.json`` through ``tokenizers``
(the ``trained`` fixture of ``tests/data/conftest.py``) and the errors of a bad file."""

import hashlib
import importlib.util

import numpy as np
import pytest

from fp8jax.data import tokenizers

needs_tokenizers = pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None,
                                      reason="needs tokenizers (data extra)")


def test_byte_tokenizer_ids_are_the_utf8_bytes():
  tok = tokenizers.get_tokenizer("bytes")
  assert isinstance(tok, tokenizers.ByteTokenizer)
  assert (tok.vocab_size, tok.eos_id, tok.fingerprint) == (257, 256, "bytes")
  ids = tok.encode("aé")  # 'a' = 0x61; 'é' = 0xC3 0xA9 in UTF-8
  assert ids.dtype == np.int32 and ids.tolist() == [0x61, 0xC3, 0xA9]
  assert tok.decode([0x61, 256, 0xC3, 0xA9, 256]) == "aé"  # the EOS id decodes to nothing
  assert [i.tolist() for i in tok.encode_batch(["", "b"])] == [[], [0x62]]
  assert tokenizers.ByteTokenizer(eos_id=0).fingerprint == "bytes/eos=0"


def test_byte_tokenizer_round_trip():
  tok = tokenizers.ByteTokenizer()
  text = "FP8 — naïve ünïcode"
  ids = tok.encode(text)
  assert ids.max() < 256 and tok.vocab_size == 257
  assert tok.decode(np.concatenate([ids, [tok.eos_id]])) == text


@needs_tokenizers
def test_hf_tokenizer_ids_eos_and_fingerprint(trained):
  path = trained[0] / "tokenizer.json"
  tok = tokenizers.get_tokenizer(str(path))
  digest = hashlib.sha256(path.read_bytes()).hexdigest()
  assert tok.fingerprint == "sha256:" + digest[:32]
  assert (tok.vocab_size, tok.eos_id) == (600, 0)  # "<|endoftext|>", learnt first
  assert tokenizers.HFTokenizer(str(path), eos_token="<|pad|>").eos_id == 1
  slow = tokenizers.HFTokenizer(str(path), fast=False)
  text = "fp8 tokens, twice: fp8 tokens"
  assert tok.encode(text).tolist() == slow.encode(text).tolist()
  assert slow.decode(slow.encode(text)) == text
  with pytest.raises(ValueError, match="no end-of-sequence token"):
    tokenizers.HFTokenizer(str(path), eos_token="<eos-missing>")


@needs_tokenizers
def test_missing_or_unreadable_tokenizer_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="no tokenizer file .*absent.json"):
    tokenizers.get_tokenizer(str(tmp_path / "absent.json"))
  (tmp_path / "bad.json").write_text('{"not": "a tokenizer"}')
  with pytest.raises(ValueError, match="bad.json: not a tokenizer.json"):
    tokenizers.get_tokenizer(str(tmp_path / "bad.json"))
