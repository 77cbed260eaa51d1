"""Packed batches streamed from document shards with flat memory and an exact position.

Order. Epoch ``e`` permutes the shard list with ``numpy.random.default_rng([seed, e])``;
process ``p`` of ``P`` reads the shards at positions ``p, p + P, ...`` of that permutation
(disjoint streams; it needs at least ``P`` shards). A shard is read in windows of
``window`` consecutive records (lines or rows, :mod:`fp8jax.data.shards`); the documents
of window ``w`` of shard ``s`` (its index in the shard list) are visited in the
permutation ``default_rng([seed, e, s, w])``. So the order depends only on the files,
the seed and the epoch, and at most ``(prefetch + 1) * window`` documents are held.

Packing. Each document is tokenized, followed by EOS, and the token stream is cut into
this process's ``global_batch / P`` rows of ``seq_len`` tokens per step (the global batch
is the processes' local batches concatenated).

Position. ``get_state()`` is ``{"seed", "epoch", "shard", "file", "window", "doc",
"offset", "skipped", "read", "sizes"}``: the shard's position in this process's list for
the epoch (and its file name, checked on restore), the window, the next document within
the window's visiting order and how many of its tokens (EOS included) earlier batches
used: the rest of the packing buffer, which a restore rebuilds exactly by reading that
window again. ``skipped`` counts the bad records skipped (``skip_bad``) in the windows
read so far, over every restore. ``read`` and ``sizes`` record what the process has read:

* ``read``: the shard being read, up to the end of the current window: ``{"records": R,
  "sha256": ...}`` (16 hex digits of SHA-256 over its first R lines' bytes; JSON and text
  shards) or ``{"records": R, "size": bytes}`` (Parquet, TFRecord: the whole file);
* ``sizes``: the byte sizes of the shards read to their end (this process's shards before
  the current one in epoch 0; every shard from epoch 1 on), in that order.

A restore checks both: a shard may change (be repaired) only where the run has not read
it yet, past the current window of the current shard, or in a shard not reached yet;
a change in what was read raises ValueError naming the shard. So a run is always the run
that its files reproduce from scratch.
"""

from __future__ import annotations

import os
import queue
import threading

import numpy as np

from fp8jax.data import packing
from fp8jax.data import shards as shards_lib

_STATE_KEYS = ("seed", "epoch", "shard", "file", "window", "doc", "offset")
_CHANGE_RULE = ("a shard may change only past what the run has read (docs/reliability.md: "
                "What may change on resume)")


def encode_all(tokenizer, texts: list[str]) -> list[np.ndarray]:
  """int32 token arrays of ``texts``, batched when the tokenizer can (``encode_batch``)."""
  if hasattr(tokenizer, "encode_batch"):
    return tokenizer.encode_batch(texts)
  return [np.asarray(tokenizer.encode(t), np.int32) for t in texts]


class ShardBatches(packing.DocumentBatches):
  """This process's int32 ``[global_batch / process_count, seq_len]`` batches.

  Args:
    shards: shard files (see :func:`fp8jax.data.shards.list_shards`), the same list
      and order on every process.
    tokenizer: ``encode(str)`` (or ``encode_batch``) and ``eos_id``.
    seq_len, global_batch: tokens per row; rows per step over all processes.
    seed: non-negative shuffle seed.
    process_index, process_count: this process and the number of processes.
    field: the text field (JSON key, Parquet column, tf.Example feature).
    window: records per shuffle window.
    skip_bad: skip and count bad records instead of raising
      :class:`fp8jax.data.shards.BadRecordError`.
    prefetch: windows read and tokenized ahead by a background thread (0: none).
  """

  def __init__(self, shards, tokenizer, seq_len: int, global_batch: int, seed: int = 0,
               process_index: int = 0, process_count: int = 1, field: str = "text",
               window: int = 1024, skip_bad: bool = False, prefetch: int = 2,
               skips: shards_lib.Skips | None = None):
    self._check_layout(seq_len, global_batch, process_index, process_count)
    if seed < 0 or window < 1:
      raise ValueError(f"seed must be >= 0 and window >= 1, got {seed} and {window}")
    self.shards = [str(s) for s in shards]
    if len(self.shards) < process_count:
      raise ValueError(f"{len(self.shards)} shard(s) cannot give {process_count} processes "
                       "disjoint streams: split the files, or prepare the data "
                       "(python -m fp8jax.experiments.prepare_data) for random access")
    self.tokenizer, self.seq_len, self.seed, self.field = tokenizer, seq_len, seed, field
    self.process_index, self.process_count = process_index, process_count
    self.local_batch = global_batch // process_count
    self.window, self.skip_bad, self.prefetch = window, skip_bad, prefetch
    self.skips = skips if skips is not None else shards_lib.Skips()
    self.sizes = [os.path.getsize(s) for s in self.shards]
    self._pos = (0, 0, 0)  # (epoch, shard, window) of the window being packed
    self.doc, self.offset = 0, 0
    self.skipped, self.read = 0, None  # see the module docstring
    self._saved_read = None  # a restored position's "read", checked on its first window
    self._docs = None  # token arrays of the current window, in visiting order
    self._source = None  # iterator of windows from `self._pos` on (a thread's or not)

  def my_shards(self, epoch: int) -> list[int]:
    """Indices (into ``shards``) of this process's shards in ``epoch``, in order."""
    order = np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))
    return [int(i) for i in order[self.process_index::self.process_count]]

  def _read_window(self, it, w: int, pending):
    """(texts of window ``w``, the first record past it or None at the shard's end)."""
    lo, hi = w * self.window, (w + 1) * self.window
    texts = []
    record = pending
    while True:
      if record is None:
        record = next(it, None)
        if record is None:
          return texts, None
      if record[0] >= hi:
        return texts, record
      if record[0] >= lo:
        texts.append(record[1])
      record = None

  def _read_mark(self, reader, s: int, w: int, pending) -> dict:
    """What the read of window ``w`` of shard ``s`` covers (``read``, module docstring)."""
    hi = (w + 1) * self.window
    if pending is not None and hi in reader.marks:
      return {"records": hi, "sha256": reader.marks.pop(hi)}
    if pending is None and "end" in reader.marks:
      lines, digest = reader.marks["end"]
      return {"records": lines, "sha256": digest}
    return {"records": hi, "size": os.path.getsize(self.shards[s])}

  def _windows(self, epoch: int, k: int, w: int):
    """Yields ``((epoch, shard, window), token arrays in visiting order, bad records
    skipped since the previous window, read)`` from a position, through the epochs;
    windows without documents are passed over."""
    counted = self.skips.count
    while True:
      mine, found, whole = self.my_shards(epoch), False, k == 0 and w == 0
      for j in range(k, len(mine)):
        s = mine[j]
        with shards_lib.ShardReader(self.shards[s], self.field, start=w * self.window,
                                    skip_bad=self.skip_bad, skips=self.skips,
                                    mark_every=self.window) as reader:
          it, pending = iter(reader), None
          while True:
            texts, pending = self._read_window(it, w, pending)
            if texts:
              found = True
              tokens = encode_all(self.tokenizer, texts)
              order = np.random.default_rng([self.seed, epoch, s, w]).permutation(len(texts))
              eos = np.asarray([self.tokenizer.eos_id], np.int32)
              skipped, counted = self.skips.count - counted, self.skips.count
              yield ((epoch, j, w), [np.concatenate([tokens[i], eos]) for i in order],
                     skipped, self._read_mark(reader, s, w, pending))
            if pending is None:
              break
            w = pending[0] // self.window
        w = 0
      if whole and not found:
        raise ValueError(f"process {self.process_index}'s shards of epoch {epoch} hold no "
                         f"documents in field {self.field!r}: {[self.shards[i] for i in mine]}")
      epoch, k = epoch + 1, 0

  def _start(self) -> None:
    gen = self._windows(*self._pos)
    self._source = _Prefetch(gen, self.prefetch) if self.prefetch else gen

  def _next_window(self) -> None:
    if self._source is None:
      self._start()
    pos, docs, skipped, read = next(self._source)
    resumed = self._docs is None and bool(self.doc or self.offset)  # read before a restore
    if self._docs is None and pos != self._pos:  # the first window after a start/restore
      if self.doc or self.offset:
        raise ValueError(f"data position {self.get_state()} names a window that holds no "
                         f"document now (the next one is {pos}): did the shards change?")
    if resumed and self._saved_read not in (None, read):
      raise ValueError(
          f"data shard {self.shards[self.my_shards(pos[0])[pos[1]]]} changed in the part "
          f"this run has already read ({self._saved_read} at the checkpoint, {read} now): "
          f"{_CHANGE_RULE}")
    if not resumed:  # a restored window's skips were counted before the checkpoint
      self.skipped += skipped
    self.read = read
    if self._docs is None and self.doc > len(docs):
      raise ValueError(f"data position {self.get_state()} is past the {len(docs)} "
                       "documents of its window: did the shards change?")
    if self._docs is not None:
      self.doc, self.offset = 0, 0
    self._pos, self._docs = pos, docs
    if self.doc < len(docs) and self.offset >= len(docs[self.doc]):
      raise ValueError(f"data position offset {self.offset} is past the "
                       f"{len(docs[self.doc])} tokens of its document (another tokenizer?)")

  def _current(self) -> np.ndarray:
    """Tokens of document ``self.doc`` of the window (the next windows read as needed)."""
    while self._docs is None or self.doc >= len(self._docs):
      self._next_window()
    return self._docs[self.doc]

  def _next_document(self) -> None:
    self.doc, self.offset = self.doc + 1, 0

  def get_state(self) -> dict:
    """The position of the next batch (JSON-serialisable; see the module docstring)."""
    epoch, k, w = self._pos
    name = self.shards[self.my_shards(epoch)[k]].rsplit("/", 1)[-1]
    return {"seed": self.seed, "epoch": epoch, "shard": k, "file": name, "window": w,
            "doc": self.doc, "offset": self.offset, "skipped": self.skipped,
            "read": self.read, "sizes": [self.sizes[i] for i in self._finished(epoch, k)]}

  def _finished(self, epoch: int, k: int) -> list[int]:
    """Indices of the shards read to their end before position (epoch, k)."""
    return self.my_shards(epoch)[:k] if epoch == 0 else list(range(len(self.shards)))

  def set_state(self, state: dict) -> None:
    """Continues from a ``get_state()`` of a run with the same shards, seed, processes."""
    if int(state.get("seed", self.seed)) != self.seed:
      raise ValueError(f"the saved data position used seed {state['seed']}, this run "
                       f"uses {self.seed}")
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
      raise ValueError(f"data position {state} lacks {missing}: it is not a position in "
                       "document shards (another data source?)")
    epoch, k, w, doc, offset = (int(state[key]) for key in
                                ("epoch", "shard", "window", "doc", "offset"))
    mine = self.my_shards(max(epoch, 0))
    if min(epoch, k, w, doc, offset) < 0 or k >= len(mine):
      raise ValueError(f"data position {state} is out of range for {len(mine)} shards "
                       "per epoch and process")
    name = self.shards[mine[k]].rsplit("/", 1)[-1]
    if name != state["file"]:
      raise ValueError(f"data position {state} is in shard {state['file']}, but this run's "
                       f"shard {k} of epoch {epoch} is {name}: different shards?")
    sizes = state.get("sizes")
    if sizes is not None:
      for i, size in zip(self._finished(epoch, k), sizes):
        if self.sizes[i] != size:
          raise ValueError(f"data shard {self.shards[i]} has {self.sizes[i]} bytes, but this "
                           f"run read it to its end when it had {size}: {_CHANGE_RULE}")
    self.close()
    self._pos, self.doc, self.offset = (epoch, k, w), doc, offset
    self.skipped, self.read = int(state.get("skipped", 0)), state.get("read")
    self._saved_read = self.read

  def close(self) -> None:
    """Stops the reading thread; iterating again restarts it from the position."""
    if self._source is not None:
      self._source.close()
    self._source, self._docs = None, None


class _Prefetch:
  """Runs a generator in a daemon thread, ``depth`` items ahead; re-raises its errors."""

  def __init__(self, gen, depth: int):
    self._gen, self._queue = gen, queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True, name="fp8jax-data")
    self._thread.start()

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _run(self) -> None:
    try:
      for item in self._gen:
        if not self._put((True, item)):
          return
    except BaseException as e:  # pylint: disable=broad-except  # re-raised by __next__
      self._put((False, e))
    finally:
      self._gen.close()

  def __next__(self):
    ok, item = self._queue.get()
    if not ok:
      self.close()
      raise item
    return item

  def close(self) -> None:
    self._stop.set()
    while self._thread.is_alive():
      try:
        self._queue.get(timeout=0.05)
      except queue.Empty:
        pass
    self._thread.join()
