"""fp8jax.data.progress: durations, ETAs and byte counts as text, and the progress line on a
terminal and in a log."""

import io

from fp8jax.data import progress


def test_durations_etas_and_bytes_as_text():
  assert progress.format_duration(3 * 3600 + 4 * 60 + 5.4) == "3:04:05"
  assert progress.format_duration(59.6) == "0:01:00" and progress.format_duration(-3) == "0:00:00"
  assert progress.eta(10.0, 2.0, 6.0) == 30.0  # 2 units in 10 s: 6 more take 30 s
  assert progress.eta(10.0, 0.0, 6.0) is None
  assert progress.eta_text(3725) == "ETA 1:02:05" and progress.eta_text(None) == "ETA ?"
  assert progress.format_bytes(999) == "999 B"
  assert progress.format_bytes(1500) == "1.5 KB"
  assert progress.format_bytes(2.5e9) == "2.5 GB"
  assert progress.format_bytes(7e15) == "7000.0 TB"


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_progress_lines_in_a_log_and_on_a_terminal():
  log = io.StringIO()
  bar = progress.Progress(200, prefix="tok", stream=log, every=3600)
  bar.update(50, detail="50/200", rate="9 MB/s", force=True)
  bar.update(100)  # within `every` seconds of the last line: not written
  bar.close()
  lines = log.getvalue().splitlines()
  assert len(lines) == 1
  assert lines[0].startswith("[tok] [#####...............]  25.0% 50/200  9 MB/s  ETA ")
  term = _Terminal()
  bar = progress.Progress(4, stream=term)
  bar.update(8, force=True)  # past the total: shown as done
  bar.close()
  out = term.getvalue()
  assert out.startswith("\r[progress] [" + "#" * 20 + "] 100.0%")
  assert out.endswith("ETA 0:00:00\x1b[K\n")
