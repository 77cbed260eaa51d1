"""A progress line for people: fraction done, throughput and ETA.

On a terminal the line is redrawn in place (at most every 0.5 s); otherwise a new line is
printed at most every ``every`` seconds, so logs stay short.
"""

from __future__ import annotations

import sys
import time


def format_duration(seconds: float) -> str:
  """``h:mm:ss`` of a duration in seconds (negative: 0:00:00)."""
  s = max(0, int(round(seconds)))
  return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def eta(elapsed: float, done: float, left: float) -> float | None:
  """Seconds until ``left`` more units are done at the rate of ``done`` units in
  ``elapsed`` seconds; None before anything is done."""
  return elapsed / done * left if done > 0 else None


def eta_text(seconds: float | None) -> str:
  """``ETA h:mm:ss``, or ``ETA ?`` when unknown (None)."""
  return f"ETA {format_duration(seconds) if seconds is not None else '?'}"


def format_bytes(n: float) -> str:
  for unit in ("B", "KB", "MB", "GB", "TB"):
    if abs(n) < 1000 or unit == "TB":
      return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
    n /= 1000
  return f"{n:.1f} TB"


class Progress:
  """``[prefix] [#####.....] 42.0% <detail>  <rate>  ETA h:mm:ss`` over ``total`` units.

  Args:
    total: the amount of work (e.g. input bytes).
    prefix: the line's tag.
    stream: where to write (default stderr).
    every: seconds between lines when the stream is not a terminal.
  """

  def __init__(self, total: float, prefix: str = "progress", stream=None, every: float = 30.0):
    self.total, self.prefix, self.every = max(float(total), 1e-9), prefix, every
    self.stream = stream or sys.stderr
    self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
    self.t0 = time.perf_counter()
    self._last = -1e9
    self._drawn = False

  def update(self, done: float, detail: str = "", rate: str = "", force: bool = False):
    now = time.perf_counter()
    if not force and now - self._last < (0.5 if self.tty else self.every):
      return
    self._last = now
    frac = min(max(done / self.total, 0.0), 1.0)
    bar = "#" * int(frac * 20) + "." * (20 - int(frac * 20))
    line = (f"[{self.prefix}] [{bar}] {100 * frac:5.1f}% {detail}  {rate}  "
            f"{eta_text(eta(now - self.t0, frac, 1 - frac))}")
    if self.tty:
      print("\r" + line + "\x1b[K", end="", file=self.stream, flush=True)
      self._drawn = True
    else:
      print(line, file=self.stream, flush=True)

  def close(self) -> None:
    if self._drawn:
      print(file=self.stream, flush=True)
      self._drawn = False
