"""Packing documents into fixed-length sequences and a resumable, sharded batch iterator.

Documents are tokenized, each followed by EOS, concatenated and cut into sequences of
``seq_len`` tokens (the last partial sequence is dropped). Every epoch visits the
sequences in a permutation fixed by ``(seed, epoch)``; a global batch is split evenly
across processes. The iterator position ``{"epoch", "step"}`` is a small dict to store
in checkpoints.
"""

from __future__ import annotations

import itertools

import numpy as np

_CHUNK = 1024  # documents per tokenizer call


def pack(docs, tokenizer, seq_len: int) -> np.ndarray:
  """int32 [num_sequences, seq_len] from the documents, with EOS after each one (the
  documents tokenized ``_CHUNK`` at a time by ``tokenizer.encode_batch``)."""
  if seq_len < 2:
    raise ValueError(f"seq_len must be >= 2, got {seq_len}")
  eos = np.asarray([tokenizer.eos_id], np.int32)
  docs, parts = iter(docs), []
  while chunk := list(itertools.islice(docs, _CHUNK)):
    for ids in tokenizer.encode_batch(chunk):
      parts += [np.asarray(ids, np.int32), eos]
  stream = np.concatenate(parts) if parts else np.zeros(0, np.int32)
  n = len(stream) // seq_len
  if n == 0:
    raise ValueError(f"the documents hold {len(stream)} tokens, fewer than one sequence "
                     f"of {seq_len}")
  return stream[: n * seq_len].reshape(n, seq_len)


class BatchIterator:
  """Deterministic, globally shuffled, per-process batches over packed sequences.

  Args:
    sequences: int32 [N, S] packed sequences (the same on every process).
    global_batch: sequences per step over all processes.
    seed: shuffle seed.
    process_index, process_count: this process's share of each global batch.
  """

  def __init__(self, sequences: np.ndarray, global_batch: int, seed: int = 0,
               process_index: int = 0, process_count: int = 1):
    if global_batch % process_count:
      raise ValueError(f"global batch {global_batch} is not divisible by the "
                       f"{process_count} processes")
    if global_batch > len(sequences):
      raise ValueError(f"global batch {global_batch} exceeds the {len(sequences)} packed "
                       "sequences")
    self.sequences = sequences
    self.global_batch = global_batch
    self.seed = seed
    self.local = slice(process_index * global_batch // process_count,
                       (process_index + 1) * global_batch // process_count)
    self.steps_per_epoch = len(sequences) // global_batch
    self.epoch, self.step = 0, 0

  def _order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(len(self.sequences))

  def __iter__(self):
    return self

  def __next__(self) -> np.ndarray:
    """This process's int32 [global_batch / process_count, S] batch."""
    if self.step >= self.steps_per_epoch:
      self.epoch, self.step = self.epoch + 1, 0
    rows = self._order(self.epoch)[self.step * self.global_batch:
                                   (self.step + 1) * self.global_batch]
    self.step += 1
    return self.sequences[rows[self.local]]

  def get_state(self) -> dict:
    return {"epoch": self.epoch, "step": self.step, "seed": self.seed}

  def set_state(self, state: dict) -> None:
    if state.get("seed", self.seed) != self.seed:
      raise ValueError(f"the saved data position used seed {state['seed']}, this run "
                       f"uses {self.seed}")
    self.epoch, self.step = int(state["epoch"]), int(state["step"])


class DocumentBatches:
  """Batches cut from a stream of documents, each continuing where the last one stopped.

  A subclass sets ``local_batch``, ``seq_len`` and ``offset`` (tokens of the current
  document already taken) and defines ``_current()`` (the current document's int32 tokens,
  reading ahead as needed) and ``_next_document()`` (moves to the next one, offset 0).
  """

  local_batch: int
  seq_len: int
  offset: int

  @staticmethod
  def _check_layout(seq_len: int, global_batch: int, process_index: int,
                    process_count: int) -> None:
    """Raises ValueError unless rows of ``seq_len`` >= 2 tokens, a global batch split
    evenly over the processes and a process index among them."""
    if seq_len < 2:
      raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    if global_batch < 1 or global_batch % process_count:
      raise ValueError(f"global batch {global_batch} is not divisible by the "
                       f"{process_count} processes")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} not in [0, {process_count})")

  def _current(self) -> np.ndarray:
    raise NotImplementedError

  def _next_document(self) -> None:
    raise NotImplementedError

  def __iter__(self):
    return self

  def __next__(self) -> np.ndarray:
    """This process's int32 [local_batch, seq_len] batch: the documents' tokens in order."""
    out = np.empty(self.local_batch * self.seq_len, np.int32)
    filled = 0
    while filled < len(out):
      tokens = self._current()
      take = min(len(out) - filled, len(tokens) - self.offset)
      out[filled:filled + take] = tokens[self.offset:self.offset + take]
      filled, self.offset = filled + take, self.offset + take
      if self.offset == len(tokens):
        self._next_document()
    return out.reshape(self.local_batch, self.seq_len)
