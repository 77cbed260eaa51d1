"""Streaming batches from any tensorflow-datasets dataset (e.g. C4) without TensorFlow.

:func:`tfds_source` opens a prepared dataset through ``tfds.data_source`` (ArrayRecord
files, random access, no TensorFlow) and exposes one text field of its records as a
random-access sequence of ``str``. :class:`StreamingBatches` turns any such sequence into
packed token batches without holding the corpus in memory; it has the interface of
:class:`fp8jax.data.packing.BatchIterator`.

Order of the documents. Epoch ``e`` visits the ``n`` documents in grain's random-access
permutation ``grain.MapDataset.source(docs).shuffle(seed=epoch_seed(seed, e))``: position
``i`` holds document ``grain.experimental.index_shuffle(i, max_index=n - 1,
seed=epoch_seed(seed, e), rounds=4)``, with ``epoch_seed`` a hash of ``(seed, e)``.

Processes. Each process reads its own disjoint stream: process ``p`` of ``P`` takes the
positions ``p, p + P, p + 2P, ...`` of every epoch's permutation, ``n // P`` documents per
epoch each (the last ``n % P`` positions of an epoch are skipped, so that all processes
run through epochs in step). A process tokenizes its documents, appends EOS after each,
concatenates them and cuts ``global_batch / P`` rows of ``seq_len`` tokens per step. The
global batch is the concatenation of the processes' local batches; it therefore depends on
the process count (unlike ``BatchIterator``, whose global batch does not).

State. ``get_state()`` is ``{"seed", "epoch", "doc", "offset"}``: the seed, the epoch, the
cursor of the next document in this process's stream of that epoch and how many of its
tokens (EOS included) earlier batches already used. Packing is done here rather than with
grain's packing iterators so that the state stays this small, JSON-serialisable dict and
resuming reproduces exactly the batches of an uninterrupted run.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from fp8jax.data import packing

_INSTALL_HINT = "pip install fp8jax[data]"


def _import(module: str):
  """Imports ``module`` (tensorflow_datasets or grain) or says how to install it."""
  import importlib  # pylint: disable=import-outside-toplevel

  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(f"streaming tfds data needs {module}: {_INSTALL_HINT}") from e


class TextSource:
  """Random-access documents: ``source[i]`` is record ``i``'s ``field`` as ``str``."""

  def __init__(self, records, field: str = "text", name: str = "records"):
    self.records, self.field, self.name = records, field, name

  def __len__(self) -> int:
    return len(self.records)

  def __getitem__(self, index: int) -> str:
    record = self.records[index]
    try:
      value = record[self.field]
    except (KeyError, TypeError):
      keys = sorted(record) if isinstance(record, dict) else type(record).__name__
      raise KeyError(f"{self.name}: record {index} has no field {self.field!r}; "
                     f"available: {keys}") from None
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)

  def __repr__(self) -> str:
    return f"TextSource({self.name}, field={self.field!r}, {len(self)} documents)"


def tfds_source(name: str, split: str = "train", data_dir: str | None = None,
                field: str = "text") -> TextSource | list[str]:
  """The documents of a prepared tfds dataset, e.g. ``tfds_source("c4/en:3.1.0")``.

  Nothing is downloaded or generated: the dataset must already be prepared in
  ``data_dir`` (default: ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``). Prepared as
  ArrayRecord, its records are returned as a random-access :class:`TextSource` (opening
  reads metadata and one record only). Prepared as TFRecord (the public ``c4/en:3.0.1``),
  which allows no random access, the split's files are returned as a list of paths, to
  stream as shards (:mod:`fp8jax.data.stream`; reading them needs TensorFlow).

  Raises:
    ImportError: tensorflow-datasets is not installed.
    FileNotFoundError: ``data_dir`` does not exist, or the dataset is not prepared there.
    ValueError: tfds knows no dataset ``name``, or the split is empty.
    KeyError: the records have no ``field`` (the message lists their keys).
  """
  if data_dir is not None:
    if not pathlib.Path(data_dir).expanduser().is_dir():
      raise FileNotFoundError(f"tfds data_dir {data_dir} does not exist")
    data_dir = str(pathlib.Path(data_dir).expanduser())
  tfds = _import("tensorflow_datasets")
  if name.startswith("c4"):
    import tensorflow_datasets.text.c4  # noqa: F401  # pylint: disable=import-outside-toplevel
  where = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
  try:
    records = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ValueError(f"tfds has no dataset {name!r}: {str(e).splitlines()[0]}") from e
  except (NotImplementedError, AssertionError, FileNotFoundError, OSError) as e:
    files = tfrecord_files(tfds, name, split, data_dir) if isinstance(
        e, NotImplementedError) else []
    if files:
      return files
    raise FileNotFoundError(
        f"tfds dataset {name!r} (split {split!r}) is not prepared as ArrayRecord or TFRecord "
        f"in data_dir {where}. Copy the prepared files (with their dataset_info.json) under "
        f"{where}, or prepare it, e.g. `tfds build {name.split(':')[0]} --data_dir={where} "
        "--file_format=array_record` (docs/study_2b.md). tfds said: "
        f"{str(e).splitlines()[0]}") from e
  source = TextSource(records, field, f"tfds {name}[{split}]")
  if len(source) == 0:
    raise ValueError(f"{source.name} holds no records")
  source[0]  # noqa: B018  # fails now, naming the keys, if the records lack `field`
  return source


def tfrecord_files(tfds, name: str, split: str, data_dir: str | None) -> list[str]:
  """The files of ``split`` of a dataset prepared as TFRecord ([] if it is not)."""
  try:
    info = tfds.builder(name, data_dir=data_dir).info
    if str(getattr(info.file_format, "value", info.file_format)) != "tfrecord":
      return []
    files = [str(p) for p in info.splits[split].filepaths]
  except (KeyError, ValueError, OSError):
    return []
  missing = [f for f in files if not pathlib.Path(f).is_file()]
  if missing:
    raise FileNotFoundError(f"tfds dataset {name!r} lacks {len(missing)} of its {split} "
                            f"TFRecord files, e.g. {missing[0]}")
  return files


def epoch_seed(seed: int, epoch: int) -> int:
  """The 32-bit shuffle seed of ``epoch``: a hash of ``(seed, epoch)``."""
  return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


class StreamingBatches(packing.DocumentBatches):
  """Per-process packed batches streamed from a random-access sequence of documents.

  Args:
    docs: random-access documents (``len`` and ``docs[i]``: a ``str``, or int token ids
      such as :class:`fp8jax.data.prepared.PreparedDocs` gives), e.g. a
      :class:`TextSource` or a list.
    tokenizer: has ``encode(str) -> int array`` and ``eos_id``.
    seq_len: tokens per row.
    global_batch: rows per step over all processes.
    seed: non-negative shuffle seed.
    process_index, process_count: this process and the number of processes.
    read_threads, read_ahead: threads reading and tokenizing documents ahead of use and
      how many documents they keep ready (0 threads: read in the calling thread).
  """

  def __init__(self, docs, tokenizer, seq_len: int, global_batch: int, seed: int = 0,
               process_index: int = 0, process_count: int = 1, read_threads: int = 2,
               read_ahead: int = 64):
    self._check_layout(seq_len, global_batch, process_index, process_count)
    if seed < 0:
      raise ValueError(f"seed must be >= 0, got {seed}")
    self._grain = _import("grain")
    self.docs, self.tokenizer, self.seq_len, self.seed = docs, tokenizer, seq_len, seed
    self.process_index, self.process_count = process_index, process_count
    self.local_batch = global_batch // process_count
    self.docs_per_epoch = len(docs) // process_count
    if self.docs_per_epoch == 0:
      raise ValueError(f"{len(docs)} documents cannot be shared by {process_count} processes")
    self._read = self._grain.ReadOptions(num_threads=read_threads,
                                         prefetch_buffer_size=read_ahead if read_threads else 0)
    self.epoch, self.doc, self.offset = 0, 0, 0
    self._it = None  # token arrays of this process's documents from `self.doc` on
    self._tokens = None  # tokens (EOS included) of document `self.doc`, once read

  def _encode(self, doc) -> np.ndarray:
    """Token ids of a document (a str, or already int token ids), then EOS."""
    ids = doc if isinstance(doc, np.ndarray) else np.asarray(self.tokenizer.encode(doc), np.int32)
    return np.concatenate([ids, np.asarray([self.tokenizer.eos_id], np.int32)])

  def _epoch_docs(self, epoch: int):
    """grain MapDataset: this process's token arrays of ``epoch``, in visiting order."""
    shuffled = self._grain.MapDataset.source(self.docs).shuffle(seed=epoch_seed(self.seed, epoch))
    stop = self.docs_per_epoch * self.process_count
    return shuffled[self.process_index:stop:self.process_count].map(self._encode)

  def _close(self) -> None:
    if self._it is not None:
      self._it.close()
    self._it, self._tokens = None, None

  def _current(self) -> np.ndarray:
    """Tokens of document ``self.doc`` of ``self.epoch`` (read ahead by grain)."""
    if self._tokens is None:
      if self._it is None:
        ds = self._epoch_docs(self.epoch)[self.doc:]
        self._it = iter(ds.to_iter_dataset(self._read))
      self._tokens = next(self._it)
      if self.offset >= len(self._tokens):
        raise ValueError(f"data state offset {self.offset} is past the {len(self._tokens)} "
                         f"tokens of document {self.doc} (another tokenizer or dataset?)")
    return self._tokens

  def _next_document(self) -> None:
    self._tokens, self.doc, self.offset = None, self.doc + 1, 0
    if self.doc == self.docs_per_epoch:
      self._close()
      self.epoch, self.doc = self.epoch + 1, 0

  def get_state(self) -> dict:
    """``{"seed", "epoch", "doc", "offset"}`` (ints): the position of the next batch."""
    return {"seed": self.seed, "epoch": self.epoch, "doc": self.doc, "offset": self.offset}

  def set_state(self, state: dict) -> None:
    """Continues from a ``get_state()`` of a run with the same data, seed and processes."""
    if int(state.get("seed", self.seed)) != self.seed:
      raise ValueError(f"the saved data position used seed {state['seed']}, this run "
                       f"uses {self.seed}")
    epoch, doc, offset = int(state["epoch"]), int(state["doc"]), int(state["offset"])
    if min(epoch, doc, offset) < 0 or doc >= self.docs_per_epoch:
      raise ValueError(f"data state {state} is out of range for {self.docs_per_epoch} "
                       "documents per epoch and process")
    self._close()
    self.epoch, self.doc, self.offset = epoch, doc, offset

  def close(self) -> None:
    """Stops the reading threads; iterating again restarts them."""
    self._close()
