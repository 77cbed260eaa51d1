"""Tokenizers: UTF-8 bytes (default, no files) or any HF ``tokenizer.json``."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
  """UTF-8 bytes as ids 0..255 and ``eos_id`` = 256 (vocabulary of 257)."""

  eos_id: int = 256

  @property
  def vocab_size(self) -> int:
    return 257

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

  def decode(self, ids) -> str:
    ids = np.asarray(ids)
    return bytes(ids[ids < 256].astype(np.uint8)).decode("utf-8", errors="replace")


class HFTokenizer:
  """A ``tokenizer.json`` through the ``tokenizers`` package (no transformers, no torch)."""

  def __init__(self, path: str, eos_token: str | None = None):
    from tokenizers import Tokenizer  # pylint: disable=import-outside-toplevel

    self._tok = Tokenizer.from_file(str(path))
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    candidates = [eos_token] if eos_token else ["<｜end▁of▁sentence｜>", "</s>", "<|endoftext|>",
                                                "<eos>"]
    ids = [self._tok.token_to_id(t) for t in candidates if t]
    ids = [i for i in ids if i is not None]
    if not ids:
      raise ValueError(f"{path}: no end-of-sequence token among {candidates}; pass eos_token")
    self.eos_id = ids[0]

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, np.int32)

  def decode(self, ids) -> str:
    return self._tok.decode([int(i) for i in ids])


def get_tokenizer(spec: str):
  """"bytes" or a path to a ``tokenizer.json``."""
  return ByteTokenizer() if spec == "bytes" else HFTokenizer(spec)
