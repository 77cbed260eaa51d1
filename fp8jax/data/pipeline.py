"""One factory for the training batches of every data source, and cheap up-front checks.

Sources (:data:`SOURCES`):

* ``"embedded"``: the Python documentation's help topics
  (:func:`fp8jax.data.sources.embedded_corpus`), packed in memory.
* ``"files"``: local ``.txt`` / ``.jsonl`` files given as ``paths``, packed in memory.
* ``"tfds:<name>"``: a prepared tensorflow-datasets dataset, e.g. ``"tfds:c4/en:3.1.0"``,
  streamed from ArrayRecord files (:mod:`fp8jax.data.tfds_source`).

In-memory sources give a :class:`fp8jax.data.packing.BatchIterator`, tfds sources a
:class:`fp8jax.data.tfds_source.StreamingBatches`; both yield this process's int32
``[global_batch / process_count, seq_len]`` batches and save their position with
``get_state()`` / ``set_state()``. :func:`validate` and :func:`check_vocab` find a wrong
data configuration before any model is built or compiled.
"""

from __future__ import annotations

import pathlib

from fp8jax.data import packing, sources, tfds_source

SOURCES = ("embedded", "files", "tfds:<name>")


def _parse(source: str) -> tuple[str, str]:
  """``(kind, tfds name)`` of a source string; ValueError listing the valid forms."""
  if source in ("embedded", "files"):
    return source, ""
  if source.startswith("tfds:") and source[len("tfds:"):].strip():
    return "tfds", source[len("tfds:"):].strip()
  raise ValueError(f"unknown data source {source!r}; valid forms: 'embedded', 'files' "
                   "(with paths) or 'tfds:<name>' such as 'tfds:c4/en:3.1.0'")


def validate(source: str, paths: tuple[str, ...] = (), data_dir: str | None = None,
             split: str = "train", field: str = "text") -> None:
  """Checks a data configuration without tokenizing or packing anything.

  For tfds sources this opens the dataset (metadata and one record), so a missing
  package, data_dir, prepared dataset or field is reported here.

  Raises:
    ValueError, FileNotFoundError, ImportError, KeyError: the configuration cannot work;
      the message names the source, path or field.
  """
  kind, name = _parse(source)
  if kind == "files":
    if not paths:
      raise ValueError("data source 'files' needs at least one path (.txt or .jsonl)")
    missing = [str(p) for p in paths if not pathlib.Path(p).exists()]
    if missing:
      raise FileNotFoundError(f"no such data file: {', '.join(missing)}")
  elif kind == "tfds":
    tfds_source.tfds_source(name, split=split, data_dir=data_dir, field=field)


def check_vocab(tokenizer, model_vocab_size: int) -> None:
  """Raises ValueError if the tokenizer emits ids outside the model's vocabulary."""
  needed = max(int(tokenizer.vocab_size), int(tokenizer.eos_id) + 1)
  if needed > model_vocab_size:
    raise ValueError(f"the tokenizer needs {needed} token ids (vocab_size "
                     f"{tokenizer.vocab_size}, eos_id {tokenizer.eos_id}) but the model's "
                     f"vocabulary has only {model_vocab_size}")


def make_batches(source: str, tokenizer, seq_len: int, global_batch: int, seed: int = 0,
                 process_index: int = 0, process_count: int = 1, data_dir: str | None = None,
                 paths: tuple[str, ...] = (), split: str = "train", field: str = "text"):
  """This process's batch iterator for ``source`` (see :data:`SOURCES`).

  Args:
    source: "embedded", "files" or "tfds:<name>".
    tokenizer: e.g. from :func:`fp8jax.data.tokenizers.get_tokenizer`.
    seq_len: tokens per sequence.
    global_batch: sequences per step over all processes (divisible by process_count).
    seed: shuffle seed.
    process_index, process_count: this process and the number of processes.
    data_dir: tfds data directory (tfds sources only).
    paths: ``.txt`` / ``.jsonl`` files ("files" only).
    split: tfds split (tfds sources only), e.g. "train" or "validation".
    field: the text field of JSONL lines and tfds records.

  Returns:
    An iterator of int32 ``[global_batch / process_count, seq_len]`` arrays with
    ``get_state() -> dict`` and ``set_state(dict)``.
  """
  kind, name = _parse(source)
  if global_batch < 1 or global_batch % process_count:
    raise ValueError(f"global batch {global_batch} is not divisible by the "
                     f"{process_count} processes")
  if kind == "tfds":
    docs = tfds_source.tfds_source(name, split=split, data_dir=data_dir, field=field)
    return tfds_source.StreamingBatches(docs, tokenizer, seq_len, global_batch, seed=seed,
                                        process_index=process_index,
                                        process_count=process_count)
  validate(source, paths=paths)
  docs = sources.embedded_corpus() if kind == "embedded" else sources.text_files(paths, field)
  return packing.BatchIterator(packing.pack(docs, tokenizer, seq_len), global_batch, seed=seed,
                               process_index=process_index, process_count=process_count)
