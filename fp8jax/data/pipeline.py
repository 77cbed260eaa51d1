"""One factory for the training batches of every data source, and cheap up-front checks.

Sources (:data:`SOURCES`):

* ``"embedded"``: the Python documentation's help topics
  (:func:`fp8jax.data.sources.embedded_corpus`), packed in memory.
* ``"synthetic:<MB>"``: that many megabytes of generated text that does not repeat within
  a long run (:mod:`fp8jax.data.synthetic`), packed in memory (kept on disk with
  ``$FP8JAX_DATA_CACHE``: :mod:`fp8jax.data.packed_cache`).
* ``"files"``: document shards given as ``paths`` (files, folders or globs: ``.json.gz``
  such as the allenai/c4 shards, ``.jsonl[.gz]``, ``.txt[.gz]``, ``.parquet``, TFRecord),
  streamed with flat memory (:mod:`fp8jax.data.stream`).
* ``"prepared"``: a folder written by ``python -m fp8jax.experiments.prepare_data``, given
  as ``data_dir``: token ids read at random from ArrayRecord (:mod:`fp8jax.data.prepared`).
* ``"tfds:<name>"``: a prepared tensorflow-datasets dataset, e.g. ``"tfds:c4/en:3.1.0"``:
  ArrayRecord read at random without TensorFlow (:mod:`fp8jax.data.tfds_source`), or
  TFRecord (``"tfds:c4/en:3.0.1"``) streamed as shards through TensorFlow (``tf`` extra).

Every iterator yields this process's int32 ``[global_batch / process_count, seq_len]``
batches and saves its position with ``get_state()`` / ``set_state()``; the position also
holds ``"data"``, the :func:`data_id` of the data (for prepared data, the manifest hash;
for shards their names, field and tokenizer, their contents being checked by the stream's
position, :mod:`fp8jax.data.stream`), so checkpoints record which data a run used and a
restore on other data fails.
:func:`validate` and :func:`check_vocab` find a wrong data configuration before any
model is built or compiled.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

from fp8jax.data import (
  packed_cache,
  packing,
  prepared,
  shards,
  sources,
  stream,
  synthetic,
  tfds_source,
)

SOURCES = ("embedded", "synthetic:<MB>", "files", "prepared", "tfds:<name>")


def _parse(source: str) -> tuple[str, str]:
  """``(kind, tfds name)`` of a source string; ValueError listing the valid forms."""
  if source in ("embedded", "files", "prepared"):
    return source, ""
  if source.startswith("tfds:") and source[len("tfds:"):].strip():
    return "tfds", source[len("tfds:"):].strip()
  if source == "synthetic" or source.startswith("synthetic:"):
    size = source.partition(":")[2] or "16"
    try:
      if float(size) > 0:
        return "synthetic", size
    except ValueError:
      pass
    raise ValueError(f"data source {source!r}: the synthetic corpus size must be a number of "
                     "megabytes > 0, e.g. 'synthetic:16'")
  raise ValueError(f"unknown data source {source!r}; valid forms: 'embedded', "
                   "'synthetic:<MB>', 'files' "
                   "(with paths), 'prepared' (with data_dir) or 'tfds:<name>' such as "
                   "'tfds:c4/en:3.1.0'")


def _open(source, paths=(), data_dir=None, split="train", field="text"):
  """(kind, what to read): shard paths, a PreparedDocs, a TextSource or None."""
  kind, name = _parse(source)
  if kind == "files":
    if not paths:
      raise ValueError("data source 'files' needs at least one path (files, folders or "
                       "globs of .json.gz, .jsonl, .txt, .parquet or TFRecord shards)")
    return kind, shards.list_shards(paths)
  if kind == "prepared":
    if not data_dir:
      raise ValueError("data source 'prepared' needs data_dir: the folder written by "
                       "python -m fp8jax.experiments.prepare_data")
    return kind, prepared.PreparedDocs(data_dir)
  if kind == "tfds":
    found = tfds_source.tfds_source(name, split=split, data_dir=data_dir, field=field)
    return ("files", [pathlib.Path(f) for f in found]) if isinstance(found, list) else (
        kind, found)
  if kind == "synthetic":
    return kind, float(name)
  return kind, None


def validate(source: str, paths: tuple[str, ...] = (), data_dir: str | None = None,
             split: str = "train", field: str = "text", skip_bad_records: bool = False) -> None:
  """Checks a data configuration without tokenizing or packing anything.

  Opens the data: lists the shards and reads their first document, reads a prepared
  folder's manifest, or opens a tfds dataset (metadata and one record).

  Raises:
    ValueError, FileNotFoundError, ImportError, KeyError: the configuration cannot work;
      the message names the source, path or field.
  """
  kind, what = _open(source, paths, data_dir, split, field)
  if kind == "files":
    with shards.ShardReader(what[0], field, skip_bad=skip_bad_records,
                            skips=shards.Skips(stream=False)) as reader:
      next(iter(reader), None)


def check_vocab(tokenizer, model_vocab_size: int) -> None:
  """Raises ValueError if the tokenizer emits ids outside the model's vocabulary."""
  needed = max(int(tokenizer.vocab_size), int(tokenizer.eos_id) + 1)
  if needed > model_vocab_size:
    raise ValueError(f"the tokenizer needs {needed} token ids (vocab_size "
                     f"{tokenizer.vocab_size}, eos_id {tokenizer.eos_id}) but the model's "
                     f"vocabulary has only {model_vocab_size}")


def _digest(obj) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def data_id(kind: str, what, tokenizer, split: str = "train", field: str = "text") -> str:
  """Names the token data: ``"prepared:<manifest hash>"``, or ``"<kind>:<digest>"`` of the
  shards' names and sizes (or the corpus, or the tfds dataset), field and tokenizer."""
  tok = getattr(tokenizer, "fingerprint", type(tokenizer).__name__)
  if kind == "prepared":
    return f"prepared:{what.hash}"
  if kind == "files":  # the shards' contents: checked by the stream's position
    return "files:" + _digest([[p.name] for p in what] + [field, tok])
  if kind == "tfds":
    return "tfds:" + _digest([what.name, len(what), field, tok])
  if kind == "synthetic":
    return "synthetic:" + _digest([what, tok])
  return "embedded:" + _digest([sources.embedded_corpus(), tok])


def _legacy_id(kind: str, what, tokenizer, field: str) -> str | None:
  """The data id that earlier versions gave shards (names and sizes), for their
  checkpoints: None for other sources."""
  if kind != "files":
    return None
  tok = getattr(tokenizer, "fingerprint", type(tokenizer).__name__)
  return "files:" + _digest([[p.name, p.stat().st_size] for p in what] + [field, tok])


def describe(source: str, tokenizer, paths=(), data_dir: str | None = None,
             split: str = "train", field: str = "text") -> str:
  """The :func:`data_id` of a data configuration (opens the data's metadata only)."""
  kind, what = _open(source, paths, data_dir, split, field)
  return data_id(kind, what, tokenizer, split, field)


def override(source_or_path: str) -> dict:
  """Data settings from one string: a prepared folder (``source="prepared"``), a
  ``tfds:<name>`` source, or comma-separated shard files, folders or globs
  (``source="files"``)."""
  if source_or_path.startswith("tfds:"):
    return {"source": source_or_path}
  if prepared.is_prepared(source_or_path):
    return {"source": "prepared", "data_dir": source_or_path}
  return {"source": "files", "paths": tuple(p for p in source_or_path.split(",") if p)}


class DataStream:
  """A batch iterator whose position also names its data (``"data"``, :func:`data_id`)."""

  def __init__(self, batches, data: str, legacy: str | None = None):
    self.batches, self.data, self.legacy = batches, data, legacy

  def __iter__(self):
    return self

  def __next__(self):
    return next(self.batches)

  def get_state(self) -> dict:
    return {**self.batches.get_state(), "data": self.data}

  def set_state(self, state: dict) -> None:
    """Restores a position; ValueError if it was saved on other data."""
    saved = state.get("data")
    if saved is not None and saved not in (self.data, self.legacy):
      raise ValueError(f"the saved data position is in data {saved}, but this run reads "
                       f"{self.data}: the data (files, preparation or tokenizer) changed")
    self.batches.set_state({k: v for k, v in state.items() if k != "data"})

  def close(self) -> None:
    if hasattr(self.batches, "close"):
      self.batches.close()


def make_batches(source: str, tokenizer, seq_len: int, global_batch: int, seed: int = 0,
                 process_index: int = 0, process_count: int = 1, data_dir: str | None = None,
                 paths: tuple[str, ...] = (), split: str = "train", field: str = "text",
                 skip_bad_records: bool = False) -> DataStream:
  """This process's batch iterator for ``source`` (see :data:`SOURCES`).

  Args:
    source: "embedded", "synthetic:<MB>", "files", "prepared" or "tfds:<name>".
    tokenizer: e.g. from :func:`fp8jax.data.tokenizers.get_tokenizer`; for "prepared",
      the tokenizer the data was prepared with (checked).
    seq_len: tokens per sequence.
    global_batch: sequences per step over all processes (divisible by process_count).
    seed: shuffle seed.
    process_index, process_count: this process and the number of processes.
    data_dir: the tfds data directory, or the prepared folder.
    paths: shard files, folders or globs ("files" only).
    split: tfds split (tfds sources only), e.g. "train" or "validation".
    field: the text field of JSON lines, Parquet rows and tfds records.
    skip_bad_records: skip (and count) bad records of shards instead of failing.

  Returns:
    A :class:`DataStream` of int32 ``[global_batch / process_count, seq_len]`` arrays.
  """
  if global_batch < 1 or global_batch % process_count:
    raise ValueError(f"global batch {global_batch} is not divisible by the "
                     f"{process_count} processes")
  kind, what = _open(source, paths, data_dir, split, field)
  ident = data_id(kind, what, tokenizer, split, field)
  procs = {"seed": seed, "process_index": process_index, "process_count": process_count}
  if kind == "files":
    if any(shards.shard_format(p) == "tfrecord" for p in what):
      shards.import_tensorflow("the TFRecord shards of this data source")
    it = stream.ShardBatches(what, tokenizer, seq_len, global_batch, field=field,
                             skip_bad=skip_bad_records, **procs)
  elif kind == "prepared":
    prepared.check_tokenizer(what.manifest, tokenizer, what.folder)
    it = tfds_source.StreamingBatches(what, tokenizer, seq_len, global_batch, **procs)
  elif kind == "tfds":
    it = tfds_source.StreamingBatches(what, tokenizer, seq_len, global_batch, **procs)
  elif kind == "synthetic":  # generated and tokenized once per machine with a cache
    sequences = packed_cache.packed(
        lambda: packing.pack(synthetic.corpus(what), tokenizer, seq_len), ident, seq_len)
    it = packing.BatchIterator(sequences, global_batch, **procs)
  else:
    it = packing.BatchIterator(packing.pack(sources.embedded_corpus(), tokenizer, seq_len),
                               global_batch, **procs)
  return DataStream(it, ident, _legacy_id(kind, what, tokenizer, field))
