"""Training logs: JSONL metrics rows, optional TensorBoard, and a progress line.

``metrics.jsonl`` holds one JSON object per logged step (``{"step": s, ...}``, floats).
A resumed run first drops the rows past its restored step (they are recomputed
identically) and a torn last line left by a killed process. Any other line that does not
parse is damage, not a kill: reading the file raises ValueError naming ``file:line``
(:func:`numbered_lines`, shared by every JSONL results file) and nothing is dropped.
"""

from __future__ import annotations

import contextlib
import json
import math
import pathlib
import sys
import time

from fp8jax.data import progress


@contextlib.contextmanager
def writing(path):
  """Names ``path`` in an OSError raised without a file name, as a write to an open file on
  a full disk raises it."""
  try:
    yield
  except OSError as e:
    if e.filename is None and e.errno is not None:
      raise type(e)(e.errno, e.strerror or str(e), str(path)) from e
    raise


class MetricsWriter:
  """Appends rows to ``<workdir>/metrics.jsonl`` (and TensorBoard scalars if asked)."""

  def __init__(self, workdir, tensorboard: bool = False):
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      except ImportError:
        raise ImportError("train.tensorboard needs tensorboardX: pip install tensorboardX"
                          ) from None
      self._tb = SummaryWriter(str(self.path.parent / "tensorboard"))

  def truncate_after(self, step: int) -> None:
    """Keeps the complete rows with ``row["step"] <= step`` (a torn last line is dropped;
    a damaged line elsewhere raises ValueError naming it, and the file is left as is)."""
    if not self.path.exists():
      return
    kept = [json.dumps(row, allow_nan=True) for _, row in numbered_lines(self.path)
            if row.get("step", math.inf) <= step]
    tmp = self.path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    tmp.replace(self.path)

  def write(self, row: dict) -> None:
    with writing(self.path), self.path.open("a") as f:
      f.write(json.dumps(row, allow_nan=True) + "\n")
    if self._tb is not None:
      for key, value in row.items():
        if key != "step" and isinstance(value, int | float):
          self._tb.add_scalar(key, value, row["step"])
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


class NoWriter:
  """The :class:`MetricsWriter` of processes other than 0 in a multi-process run: the
  rows are process 0's to write."""

  def truncate_after(self, step: int) -> None:
    del step

  def write(self, row: dict) -> None:
    del row

  def close(self) -> None:
    pass


def numbered_lines(path) -> list[tuple[int, dict]]:
  """``(line number, object)`` of each non-blank line of a JSONL file. An unparsable last
  line is a torn write of a killed process and is left out.

  Raises:
    FileNotFoundError: the file does not exist.
    ValueError: a line other than the last is not a JSON object: damage, named
      ``file:line`` (repair or delete that line; nothing is dropped silently).
  """
  path = pathlib.Path(path)
  lines = [(i, s) for i, s in enumerate(path.read_text().splitlines(), 1) if s.strip()]
  out = []
  for j, (i, line) in enumerate(lines):
    try:
      obj = json.loads(line)
    except json.JSONDecodeError:
      obj = None
    if not isinstance(obj, dict):
      if j == len(lines) - 1:
        break  # a torn last line
      raise ValueError(f"{path}:{i}: not a JSON object (a damaged line, not a torn last "
                       f"one; repair or delete it): {line[:80]!r}")
    out.append((i, obj))
  return out


def read_rows(path) -> list[dict]:
  """The rows of a ``metrics.jsonl`` or other JSONL results file (:func:`numbered_lines`:
  a torn last line is left out, a damaged line elsewhere raises ValueError)."""
  return [row for _, row in numbered_lines(path)]


class Progress:
  """One line per logged step: step, losses, LR, throughput, MFU and ETA."""

  def __init__(self, total: int, start: int, stream=None, prefix: str = "train"):
    self.total, self.start, self.prefix = total, start, prefix
    self.stream = stream or sys.stderr
    self.t0 = time.perf_counter()

  def eta(self, step: int) -> float | None:
    return progress.eta(time.perf_counter() - self.t0, step - self.start, self.total - step)

  def line(self, row: dict) -> str:
    step = row["step"]
    parts = [f"[{self.prefix}] step {step}/{self.total}",
             f"loss {row['loss']:.4f} (lm {row['lm_loss']:.4f} aux {row['aux_loss']:.4g})",
             f"|g| {row['grad_norm']:.3g}", f"lr {row['lr']:.3g}",
             f"{row['tokens_per_s'] / 1e3:.1f}k tok/s"]
    if row.get("mfu") is not None:
      parts.append(f"MFU {100 * row['mfu']:.1f}%")
    if row.get("loss_scale") is not None:  # FP16 dynamic loss scaling
      parts.append(f"scale {row['loss_scale']:g} skipped {row['skipped_steps']}")
    parts.append(progress.eta_text(self.eta(step)))
    return "  ".join(parts)

  def message(self, done: int, text: str) -> None:
    """``[prefix] done/total text  ETA``."""
    print(f"[{self.prefix}] {done}/{self.total} {text}  {progress.eta_text(self.eta(done))}",
          file=self.stream, flush=True)

  def show(self, row: dict) -> None:
    print(self.line(row), file=self.stream, flush=True)


class FirstCalls:
  """Where the compile time goes: the first call of each compiled function (its
  compilation and one run, waited for) said on ``stream`` as
  ``[prefix] compiling WHAT (i/total)...`` then ``[prefix] compiled WHAT in N s``; later
  calls say nothing. ``seconds``: ``{key: seconds of the first call}``."""

  def __init__(self, prefix: str, stream=None, total: int | None = None):
    self.prefix, self.stream, self.total = prefix, stream or sys.stderr, total
    self.seconds: dict = {}

  @contextlib.contextmanager
  def timed(self, key, what: str):
    """Times the block as the first call of ``key`` (nothing if ``key`` ran before); the
    block must wait for its results (``jax.device_get``, ``block_until_ready``)."""
    if key in self.seconds:
      yield
      return
    count = f" ({len(self.seconds) + 1}/{self.total})" if self.total else ""
    print(f"[{self.prefix}] compiling {what}{count}...", file=self.stream, flush=True)
    t0 = time.perf_counter()
    yield
    self.seconds[key] = dt = time.perf_counter() - t0
    print(f"[{self.prefix}] compiled {what} in {dt:.1f} s (with its first run)",
          file=self.stream, flush=True)

  def wrap(self, fn, key, what: str):
    """``fn`` whose first call is :meth:`timed` (it waits for that call's results)."""
    import jax  # pylint: disable=import-outside-toplevel

    def call(*args, **kwargs):
      if key in self.seconds:
        return fn(*args, **kwargs)
      with self.timed(key, what):
        return jax.block_until_ready(fn(*args, **kwargs))
    return call
