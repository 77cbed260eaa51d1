"""A prepared corpus: token ids in ArrayRecord files with a manifest, read at random.

:mod:`fp8jax.data.prepare` writes the folder::

    OUT/manifest.json             what was prepared from what (below); written last
    OUT/plan.json                 the job's inputs (to resume it, or to refuse a mixture)
    OUT/tokens/00000.array_record one file per source shard: one record per document, its
                                  token ids as little-endian ``dtype`` without EOS

``manifest.json`` lists the source files (name, path, size, SHA-256, records, documents,
skipped bad records), the tokenizer (fingerprint, vocabulary size, EOS id), the token
files (documents, tokens, bytes) and the totals. Its ``hash`` (:func:`manifest_hash`)
covers everything that defines the data, not where or when it was made; runs record it
in their checkpoints. The files are plain ArrayRecord (``group_size:1``): grain's
``ArrayRecordDataSource`` reads them too.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

import numpy as np

FORMAT = "fp8jax-prepared-v1"
MANIFEST = "manifest.json"


def manifest_hash(manifest: dict) -> str:
  """Hex SHA-256 (first 20 digits) of what defines the data: the format, tokenizer
  fingerprint, field, dtype, sources (name, size, SHA-256) and the token files' counts."""
  identity = {
      "format": manifest["format"], "tokenizer": manifest["tokenizer"]["fingerprint"],
      "field": manifest["field"], "dtype": manifest["dtype"],
      "sources": [[s["name"], s["bytes"], s["sha256"]] for s in manifest["sources"]],
      "files": [[f["name"], f["documents"], f["tokens"]] for f in manifest["files"]]}
  blob = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
  return hashlib.sha256(blob).hexdigest()[:20]


def is_prepared(path) -> bool:
  """Whether ``path`` is a folder with a ``manifest.json``."""
  return (pathlib.Path(path).expanduser() / MANIFEST).is_file()


def read_manifest(folder) -> dict:
  """The manifest of a finished preparation, checked against the files on disk.

  Raises:
    FileNotFoundError: no folder or manifest, or a token file is missing.
    ValueError: the preparation is unfinished, of another format, or a file's size
      differs from the manifest (a bad copy).
  """
  folder = pathlib.Path(folder).expanduser()
  path = folder / MANIFEST
  if not path.is_file():
    hint = (" (an unfinished preparation: rerun prepare_data to complete it)"
            if (folder / "plan.json").is_file() else "")
    raise FileNotFoundError(f"{folder} is not a prepared data folder: no {MANIFEST}{hint}")
  try:
    manifest = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON: {e}") from None
  if manifest.get("format") != FORMAT or not manifest.get("complete"):
    raise ValueError(f"{path}: not a finished {FORMAT} preparation")
  for f in manifest["files"]:
    file = folder / f["name"]
    if not file.is_file():
      raise FileNotFoundError(f"{folder}: token file {f['name']} of the manifest is missing")
    if file.stat().st_size != f["bytes"]:
      raise ValueError(f"{file}: {file.stat().st_size} bytes, the manifest says {f['bytes']} "
                       "(a bad copy?)")
  if manifest_hash(manifest) != manifest.get("hash"):
    raise ValueError(f"{path}: its hash field does not match its content (edited by hand?)")
  return manifest


def _array_record_source(files: list[str]):
  try:
    from array_record.python import (  # pylint: disable=import-outside-toplevel
      array_record_data_source as ards,
    )
  except ImportError as e:
    raise ImportError("reading prepared data needs array-record: pip install "
                      "fp8jax[data]") from e
  return ards.ArrayRecordDataSource(files)


def verify(folder) -> list[tuple[str, str]]:
  """Reads every record of every token file of a prepared folder: ``[(file name, "ok" or
  what is wrong)]`` in manifest order. A file is wrong when it does not read (ArrayRecord
  checks its chunks) or holds other document or token counts than the manifest says.

  Raises:
    FileNotFoundError, ValueError: as :func:`read_manifest` (no manifest, a missing file,
      a size or hash that differs from the manifest).
  """
  folder = pathlib.Path(folder).expanduser()
  manifest = read_manifest(folder)
  dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
  out = []
  for f in manifest["files"]:
    documents = tokens = 0
    try:
      if f["documents"]:
        source = _array_record_source([str(folder / f["name"])])
        for documents in range(1, len(source) + 1):
          tokens += len(source[documents - 1]) // dtype.itemsize
    except Exception as e:  # pylint: disable=broad-except  # any damage, by name
      first = str(e).strip().splitlines()[0] if str(e).strip() else ""
      out.append((f["name"], f"corrupt: document {documents} does not read "
                              f"({type(e).__name__}: {first[:200]})"))
      continue
    if (documents, tokens) != (f["documents"], f["tokens"]):
      out.append((f["name"], f"corrupt: {documents} documents and {tokens} tokens, the "
                              f"manifest says {f['documents']} and {f['tokens']}"))
    else:
      out.append((f["name"], "ok"))
  return out


def check_tokenizer(manifest: dict, tokenizer, folder) -> None:
  """Raises ValueError if ``tokenizer`` is not the one the data was prepared with."""
  want = manifest["tokenizer"]
  got = getattr(tokenizer, "fingerprint", None)
  if got != want["fingerprint"]:
    raise ValueError(f"the prepared data in {folder} was tokenized with {want['spec']} "
                     f"({want['fingerprint']}); this run's tokenizer is {got}: set "
                     "data.tokenizer to that tokenizer.json or prepare the data again")


class PreparedDocs:
  """Random-access documents of a prepared folder: ``docs[i]`` is int32 token ids.

  Args:
    folder: the prepared folder (``prepare_data --out``).
  """

  def __init__(self, folder):
    self.folder = pathlib.Path(folder).expanduser()
    self.manifest = read_manifest(self.folder)
    self.hash = self.manifest["hash"]
    self.eos_id = int(self.manifest["tokenizer"]["eos_id"])
    self.dtype = np.dtype(self.manifest["dtype"]).newbyteorder("<")
    files = [str(self.folder / f["name"]) for f in self.manifest["files"] if f["documents"]]
    if not files:
      raise ValueError(f"{self.folder}: the prepared corpus holds no documents (were its "
                       "sources empty?); prepare it again from data that has some")
    try:
      self._source = _array_record_source(files)
    except ImportError:
      raise
    except Exception as e:  # pylint: disable=broad-except  # damage, named in one line
      raise ValueError(self._damaged(f"its token files do not open ({type(e).__name__})")) from e
    if len(self._source) != self.manifest["documents"]:
      raise ValueError(f"{self.folder}: the token files hold {len(self._source)} documents, "
                       f"the manifest says {self.manifest['documents']}")

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> np.ndarray:
    try:
      record = self._source[index]
    except Exception as e:  # pylint: disable=broad-except  # damage, named in one line
      raise ValueError(self._damaged(f"document {index} does not read "
                                     f"({type(e).__name__})")) from e
    return np.frombuffer(record, self.dtype).astype(np.int32)

  def _damaged(self, what: str) -> str:
    return (f"{self.folder}: {what}; `python -m fp8jax.experiments.verify "
            f"--data={self.folder}` names the damaged token files (prepare the folder "
            "again, or restore them)")

  def __repr__(self) -> str:
    return f"PreparedDocs({self.folder}, {len(self)} documents, hash {self.hash})"
