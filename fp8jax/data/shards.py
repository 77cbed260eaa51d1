"""Local document shards, read as streams: one document in memory at a time.

Formats, by file name:

* ``.jsonl``, ``.json``, ``.jsonl.gz``, ``.json.gz``: one JSON object per line, the text in
  ``field`` (the allenai/c4 shards ``c4-train.00000-of-01024.json.gz`` have ``text``,
  ``timestamp`` and ``url``). Blank lines are allowed and hold no document.
* ``.txt``, ``.txt.gz``: one document per line (blank lines hold none).
* ``.parquet``: one document per row, the text in column ``field`` (needs ``pyarrow``,
  part of the ``data`` extra).
* ``*.tfrecord*``: ``tf.Example`` records with a bytes feature ``field``, as in the
  prepared tfds C4 (``c4-train.tfrecord-00000-of-01024``); needs TensorFlow (the ``tf``
  extra), imported only when such a shard is read.

A record is a line (JSON, text) or a row (Parquet, TFRecord), numbered from 0 in the
file; a resumed read starts at a record number. Bad input (a gzip CRC error or a
truncated file, a torn last line, a non-UTF-8 byte, a missing or non-string field) raises
:class:`BadRecordError` naming the file and line (1-based), or, with ``skip_bad``, is
counted in a :class:`Skips` and reported, never dropped silently.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import json
import pathlib
import sys
import zlib

SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".txt", ".txt.gz", ".parquet")
_SKIP_HINT = "(skip_bad_records / --skip_bad_records skips bad records, counting them)"


class BadRecordError(ValueError):
  """A record that cannot be read; the message starts with ``file:line:``."""


@dataclasses.dataclass
class Skips:
  """Bad records skipped under ``skip_bad``: their count and the first few, named."""

  count: int = 0
  examples: list = dataclasses.field(default_factory=list)
  stream: object = None  # where each skip is reported (default stderr; False: nowhere)

  def add(self, where: str, reason: str) -> None:
    self.count += 1
    if len(self.examples) < 20:
      self.examples.append(f"{where}: {reason}")
    if self.stream is not False and (self.count <= 20 or self.count % 1000 == 0):
      print(f"warning: skipped a bad record ({self.count} so far): {where}: {reason}",
            file=self.stream or sys.stderr, flush=True)


def shard_format(path) -> str:
  """``"jsonl"``, ``"txt"``, ``"parquet"`` or ``"tfrecord"`` from the file name."""
  name = pathlib.Path(path).name
  if ".tfrecord" in name:
    return "tfrecord"
  for suffix in SUFFIXES:
    if name.endswith(suffix):
      return {"json": "jsonl"}.get(suffix.split(".")[1], suffix.split(".")[1])
  raise ValueError(f"{path}: unknown shard format; expected one of "
                   f"{', '.join(SUFFIXES)} or *.tfrecord*")


def list_shards(patterns) -> list[pathlib.Path]:
  """The shard files of ``patterns`` (files, folders or globs), each sorted, in order.

  A folder stands for its files with a known suffix. Duplicates are dropped.

  Raises:
    FileNotFoundError: a pattern matches no shard.
    ValueError: no pattern, or a file of an unknown format.
  """
  if isinstance(patterns, str | pathlib.Path):
    patterns = [patterns]
  out, seen = [], set()
  for pattern in map(str, patterns):
    path = pathlib.Path(pattern).expanduser()
    if path.is_dir():
      found = sorted(p for p in path.iterdir() if p.is_file() and _known(p))
    elif any(c in pattern for c in "*?["):
      found = sorted(pathlib.Path(p) for p in glob.glob(str(path)) if pathlib.Path(p).is_file())
    else:
      found = [path] if path.is_file() else []
    if not found:
      raise FileNotFoundError(f"no data shard matches {pattern!r}")
    for p in found:
      shard_format(p)
      if p.resolve() not in seen:
        seen.add(p.resolve())
        out.append(p)
  if not out:
    raise ValueError("no data shards given (paths: files, folders or globs)")
  return out


def _known(path: pathlib.Path) -> bool:
  try:
    shard_format(path)
    return True
  except ValueError:
    return False


class ShardReader:
  """The documents of one shard from record ``start`` on: iterate for ``(record, text)``.

  ``bytes_read`` is how far into the file (its stored, possibly compressed bytes) the
  reader has got, for progress. Use as a context manager or call :meth:`close`.
  """

  def __init__(self, path, field: str = "text", start: int = 0, skip_bad: bool = False,
               skips: Skips | None = None, mark_every: int = 0):
    self.path, self.field, self.start = pathlib.Path(path), field, int(start)
    self.format = shard_format(path)
    self.skip_bad, self.skips = skip_bad, skips if skips is not None else Skips()
    self._raw = None
    self.bytes_read = 0
    # JSON / text shards with mark_every: {n: digest of lines [0, n)} at every multiple n of
    # mark_every, and "end": (lines, digest of all lines) once the file is read to its end.
    self.mark_every = mark_every if self.format in ("jsonl", "txt") else 0
    self.marks: dict = {}

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self) -> None:
    if self._raw is not None:
      self._raw.close()
      self._raw = None

  def __iter__(self):
    if not self.path.is_file():
      raise FileNotFoundError(f"no such data shard: {self.path}")
    if self.format == "parquet":
      return self._parquet()
    if self.format == "tfrecord":
      return self._tfrecord()
    return self._lines()

  def _bad(self, record: int, reason: str, unit: str = "line") -> None:
    where = f"{self.path}:{record + 1}" if unit == "line" else f"{self.path}: {unit} {record}"
    if not self.skip_bad:
      raise BadRecordError(f"{where}: {reason} {_SKIP_HINT}")
    self.skips.add(where, reason)

  def _lines(self):
    self._raw = open(self.path, "rb")  # noqa: SIM115  # closed by close()
    gz = self.path.name.endswith(".gz")
    f = gzip.GzipFile(fileobj=self._raw, mode="rb") if gz else self._raw
    n, h, every = -1, hashlib.sha256(), self.mark_every
    try:
      for n, line in enumerate(f):
        if every:
          if n and n % every == 0:
            self.marks[n] = h.hexdigest()[:16]
          h.update(line)
        if n < self.start:
          continue
        self.bytes_read = self._raw.tell()
        text = self._decode(n, line)
        if text is not None:
          yield n, text
      if every:
        self.marks["end"] = (n + 1, h.hexdigest()[:16])
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
      self._bad(n + 1, f"corrupt or truncated gzip data after line {n + 1}: {e}; the rest "
                "of the file is unreadable")
    finally:
      self.close()

  def _decode(self, n: int, line: bytes) -> str | None:
    """The document of line ``n`` (None for a blank line or a skipped bad one)."""
    torn = not line.endswith(b"\n")
    try:
      text = line.decode("utf-8")
    except UnicodeDecodeError as e:
      return self._bad(n, f"byte 0x{line[e.start]:02x} at column {e.start + 1} is not UTF-8")
    if not text or text.isspace():
      return None
    if self.format == "txt":
      return text.rstrip("\r\n")
    try:
      obj = json.loads(text)
    except json.JSONDecodeError as e:
      why = " (a torn last line: the file ends mid-record)" if torn else ""
      return self._bad(n, f"not valid JSON{why}: {e.msg} at column {e.colno}")
    if not isinstance(obj, dict) or self.field not in obj:
      keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
      return self._bad(n, f"no field {self.field!r} (has {keys})")
    value = obj[self.field]
    if not isinstance(value, str):
      return self._bad(n, f"field {self.field!r} is {type(value).__name__}, not a string")
    if not value.isascii():
      try:
        value.encode("utf-8")
      except UnicodeEncodeError as e:
        return self._bad(n, f"field {self.field!r} holds a lone surrogate {e.object[e.start]!r}"
                         " (an invalid \\u escape), not text")
    return value if value and not value.isspace() else None

  def _parquet(self):
    try:
      import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError(f"reading Parquet shard {self.path} needs pyarrow: "
                        "pip install fp8jax[data]") from e
    try:
      pf = pq.ParquetFile(self.path)
    except Exception as e:  # pylint: disable=broad-except  # pyarrow's ArrowInvalid etc.
      raise BadRecordError(f"{self.path}: not a readable Parquet file: {e}") from None
    if self.field not in pf.schema_arrow.names:
      raise BadRecordError(f"{self.path}: no column {self.field!r} (has "
                           f"{pf.schema_arrow.names})")
    size, first = self.path.stat().st_size, 0
    for g in range(pf.num_row_groups):
      rows = pf.metadata.row_group(g).num_rows
      if first + rows > self.start:
        n = first
        for batch in pf.iter_batches(batch_size=1024, row_groups=[g], columns=[self.field]):
          for value in batch.column(0).to_pylist():
            if n >= self.start:
              if not isinstance(value, str):
                self._bad(n, f"column {self.field!r} holds {type(value).__name__}, not a "
                          "string", unit="row")
              elif value and not value.isspace():
                yield n, value
            n += 1
      first += rows
      self.bytes_read = size * (g + 1) // pf.num_row_groups

  def _tfrecord(self):
    tf = import_tensorflow(f"reading TFRecord shard {self.path}")
    ds = tf.data.TFRecordDataset(str(self.path)).skip(self.start)
    n = self.start - 1
    try:
      for n, raw in enumerate(ds.as_numpy_iterator(), self.start):
        feature = tf.train.Example.FromString(raw).features.feature
        if self.field not in feature:
          self._bad(n, f"no feature {self.field!r} (has {sorted(feature)})", unit="record")
          continue
        values = feature[self.field].bytes_list.value
        try:
          text = values[0].decode("utf-8") if values else ""
        except UnicodeDecodeError as e:
          self._bad(n, f"feature {self.field!r} is not UTF-8: {e}", unit="record")
          continue
        if text and not text.isspace():
          yield n, text
    except tf.errors.OpError as e:
      self._bad(n + 1, f"corrupt or truncated TFRecord data: {e.message}", unit="record")


def import_tensorflow(what: str):
  """TensorFlow, or an ImportError saying how to install it (the ``tf`` extra)."""
  try:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(f"{what} needs TensorFlow: pip install fp8jax[tf] (tensorflow-cpu)"
                      ) from e
  return tf
