"""A disk copy of packed token sequences, so that a generated corpus is generated and
tokenized once per machine, not at every start of a binary.

``synthetic:<MB>`` text (:mod:`fp8jax.data.synthetic`) is packed in memory at each start:
hundreds of megabytes take minutes to generate and tokenize. With ``FP8JAX_DATA_CACHE``
set to a folder, :func:`packed` keeps the packed array there as ``<key>.npy`` beside
``<key>.json`` (its shape and SHA-256), named by the data's identity (the corpus, the
tokenizer's fingerprint) and the sequence length, and later starts read it back, checked
against its SHA-256. A copy that does not check out (a torn or edited file) is packed
again and replaced, with a warning naming the file. Writes go to a temporary file renamed
into place, so a kill leaves no partial copy under the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys
import tempfile

import numpy as np

ENV = "FP8JAX_DATA_CACHE"


def folder() -> pathlib.Path | None:
  """The cache folder from ``$FP8JAX_DATA_CACHE``, or None (no cache)."""
  value = os.environ.get(ENV, "")
  return pathlib.Path(value) if value and value != "off" else None


def _key(ident: str, seq_len: int) -> str:
  return hashlib.sha256(f"{ident}|{seq_len}".encode()).hexdigest()[:24]


def _sha256(array: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(array).data).hexdigest()


def _write_atomic(path: pathlib.Path, write) -> None:
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


def _load(data: pathlib.Path, meta: pathlib.Path) -> tuple[np.ndarray | None, str | None]:
  """(array, None) if the copy checks out, else (None, why)."""
  try:
    want = json.loads(meta.read_text())
    array = np.load(data, allow_pickle=False)
  except (OSError, ValueError) as e:
    return None, f"does not read ({e})"
  if list(array.shape) != want.get("shape") or _sha256(array) != want.get("sha256"):
    return None, "does not match its recorded shape and SHA-256"
  return array, None


def packed(pack, ident: str, seq_len: int, where: pathlib.Path | None = None) -> np.ndarray:
  """``pack()`` (int32 [N, seq_len]), kept in ``where`` (default :func:`folder`; None: not
  kept) under the name of ``ident`` (the data's identity) and ``seq_len``."""
  where = folder() if where is None else where
  if where is None:
    return pack()
  where.mkdir(parents=True, exist_ok=True)
  data, meta = where / f"{_key(ident, seq_len)}.npy", where / f"{_key(ident, seq_len)}.json"
  if data.exists() and meta.exists():
    array, why = _load(data, meta)
    if array is not None:
      return array
    print(f"warning: the packed-data copy {data} {why}; packing the data again",
          file=sys.stderr, flush=True)
  array = pack()
  _write_atomic(data, lambda f: np.save(f, array, allow_pickle=False))
  record = {"ident": ident, "seq_len": seq_len, "shape": list(array.shape),
            "sha256": _sha256(array)}
  _write_atomic(meta, lambda f: f.write(json.dumps(record).encode()))
  return array
