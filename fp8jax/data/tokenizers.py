"""Tokenizers: UTF-8 bytes (default, no files) or any HF ``tokenizer.json``.

Each has ``encode(str) -> int32 array``, ``encode_batch(list[str])``, ``decode``,
``vocab_size``, ``eos_id`` and ``fingerprint`` (``"bytes"`` or ``"sha256:<hex>"`` of the
``tokenizer.json`` file), which prepared data and checkpoints record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib

import numpy as np

from fp8jax.data import fast_bpe


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
  """UTF-8 bytes as ids 0..255 and ``eos_id`` = 256 (vocabulary of 257)."""

  eos_id: int = 256

  @property
  def vocab_size(self) -> int:
    return 257

  @property
  def fingerprint(self) -> str:
    return "bytes" if self.eos_id == 256 else f"bytes/eos={self.eos_id}"

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

  def encode_batch(self, texts) -> list[np.ndarray]:
    return [self.encode(t) for t in texts]

  def decode(self, ids) -> str:
    ids = np.asarray(ids)
    return bytes(ids[ids < 256].astype(np.uint8)).decode("utf-8", errors="replace")


class HFTokenizer:
  """A ``tokenizer.json`` through the ``tokenizers`` package (no transformers, no torch)."""

  def __init__(self, path: str, eos_token: str | None = None, fast: bool = True):
    from tokenizers import Tokenizer  # pylint: disable=import-outside-toplevel

    self.path = pathlib.Path(path)
    if not self.path.is_file():
      raise FileNotFoundError(f"no tokenizer file {path} (data.tokenizer: 'bytes' or a "
                              "tokenizer.json, e.g. from python -m "
                              "fp8jax.experiments.train_tokenizer)")
    self.fingerprint = "sha256:" + hashlib.sha256(self.path.read_bytes()).hexdigest()[:32]
    try:
      self._tok = Tokenizer.from_file(str(path))
    except Exception as e:  # pylint: disable=broad-except  # the tokenizers package's own
      raise ValueError(f"{path}: not a tokenizer.json that the tokenizers package reads "
                       f"({' '.join(str(e).split())[:200]})") from None
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    candidates = [eos_token] if eos_token else ["<｜end▁of▁sentence｜>", "</s>", "<|endoftext|>",
                                                "<eos>"]
    ids = [self._tok.token_to_id(t) for t in candidates if t]
    ids = [i for i in ids if i is not None]
    if not ids:
      raise ValueError(f"{path}: no end-of-sequence token among {candidates}; pass eos_token")
    self.eos_id = ids[0]
    # Tokenizers of fp8jax.data.bpe's design encode through the exact fast path.
    self._fast = (fast_bpe.FastEncoder(self._tok) if fast and fast_bpe.supports(
        self._tok.to_str()) else None)

  def encode(self, text: str) -> np.ndarray:
    if self._fast is not None:
      return self._fast.encode_batch([text])[0]
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, np.int32)

  def encode_batch(self, texts) -> list[np.ndarray]:
    """int32 ids of each text (the fast path, or the ``tokenizers`` batch encoder)."""
    if self._fast is not None:
      return self._fast.encode_batch(texts)
    encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
    return [np.asarray(e.ids, np.int32) for e in encode(list(texts), add_special_tokens=False)]

  def decode(self, ids) -> str:
    return self._tok.decode([int(i) for i in ids])


def get_tokenizer(spec: str):
  """"bytes" or a path to a ``tokenizer.json``."""
  return ByteTokenizer() if spec == "bytes" else HFTokenizer(spec)
