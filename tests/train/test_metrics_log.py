"""Training logs (``fp8jax.train.metrics_log``): JSONL rows written, truncated on resume and
read with a torn last line left out and a damaged one named by file and line; TensorBoard
scalars; the progress line; first-call compile timing."""

import errno
import io
import math
import re
import struct
import sys
import time

import jax.numpy as jnp
import pytest

from fp8jax.train import metrics_log


def _lines(path, lines):
  path.write_text("".join(f"{line}\n" for line in lines))
  return path


def test_rows_are_appended_one_json_object_a_line_with_nan_kept(tmp_path):
  writer = metrics_log.MetricsWriter(tmp_path / "new" / "run")  # the workdir is created
  writer.write({"step": 1, "loss": 2.5})
  writer.write({"step": 2, "loss": float("nan")})
  writer.close()
  path = tmp_path / "new" / "run" / "metrics.jsonl"
  assert path.read_text() == '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": NaN}\n'
  rows = metrics_log.read_rows(path)
  assert rows[0] == {"step": 1, "loss": 2.5} and math.isnan(rows[1]["loss"])


def test_numbered_lines_skip_blank_lines_and_leave_out_a_torn_last_line(tmp_path):
  path = _lines(tmp_path / "m.jsonl", ['{"step": 1}', "", '{"step": 3}', '{"step": 4, "lo'])
  assert metrics_log.numbered_lines(path) == [(1, {"step": 1}), (3, {"step": 3})]
  _lines(path, ['{"step": 1}', "7"])  # JSON, but not an object: torn as well
  assert metrics_log.read_rows(path) == [{"step": 1}]
  with pytest.raises(FileNotFoundError):
    metrics_log.read_rows(tmp_path / "absent.jsonl")


@pytest.mark.parametrize("damaged", ['{"step": 2, "lo', "[1, 2]"])
def test_a_damaged_line_before_the_last_is_named_by_file_and_line(tmp_path, damaged):
  path = _lines(tmp_path / "m.jsonl", ['{"step": 1}', "", damaged, '{"step": 3}'])
  with pytest.raises(ValueError, match=rf"m\.jsonl:3: not a JSON object \(a damaged line, "
                                       rf"not a torn last one; repair or delete it\): "
                                       rf"{re.escape(repr(damaged))}"):
    metrics_log.read_rows(path)


def test_truncate_after_keeps_the_rows_up_to_the_step_and_drops_a_torn_line(tmp_path):
  writer = metrics_log.MetricsWriter(tmp_path)
  _lines(writer.path, ['{"step": 1, "loss": 3.0}', '{"step": 2, "loss": NaN}',
                       '{"step": 3, "loss": 1.0}', '{"note": "no step"}', '{"step": 4, "l'])
  writer.truncate_after(2)
  assert writer.path.read_text() == '{"step": 1, "loss": 3.0}\n{"step": 2, "loss": NaN}\n'
  assert not writer.path.with_suffix(".jsonl.tmp").exists()
  writer.write({"step": 3, "loss": 0.5})
  assert [r["step"] for r in metrics_log.read_rows(writer.path)] == [1, 2, 3]


def test_truncate_after_leaves_a_damaged_file_as_it_is_and_a_missing_one_missing(tmp_path):
  writer = metrics_log.MetricsWriter(tmp_path)
  writer.truncate_after(5)
  assert not writer.path.exists()
  _lines(writer.path, ['{"step": 1}', "garbage", '{"step": 3}'])
  before = writer.path.read_text()
  with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a JSON object"):
    writer.truncate_after(1)
  assert writer.path.read_text() == before


def test_an_os_error_without_a_file_name_is_given_the_path_being_written(tmp_path):
  path = tmp_path / "metrics.jsonl"
  with pytest.raises(OSError) as e:
    with metrics_log.writing(path):
      raise OSError(errno.ENOSPC, "No space left on device")
  assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(path))
  assert str(path) in str(e.value)
  named = OSError(errno.EACCES, "Permission denied", "/elsewhere")
  with pytest.raises(OSError) as e:
    with metrics_log.writing(path):
      raise named
  assert e.value is named  # already named: unchanged


def _scalars(folder):
  """``[(step, tag, value)]`` of the TensorBoard event files under ``folder`` (TFRecords:
  length, its CRC, an Event, its CRC)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  out = []
  for f in sorted(folder.glob("events.out.tfevents.*")):
    raw, i = f.read_bytes(), 0
    while i < len(raw):
      (n,) = struct.unpack("<Q", raw[i:i + 8])
      event = event_pb2.Event.FromString(raw[i + 12:i + 12 + n])
      out += [(event.step, v.tag, v.simple_value) for v in event.summary.value]
      i += 16 + n
  return out


def test_tensorboard_gets_the_numeric_fields_of_each_row_at_its_step(tmp_path):
  writer = metrics_log.MetricsWriter(tmp_path, tensorboard=True)
  writer.write({"step": 1, "loss": 2.5, "policy": "bf16", "skipped": 3})
  writer.write({"step": 2, "loss": 1.5})
  writer.close()
  assert _scalars(tmp_path / "tensorboard") == [(1, "loss", 2.5), (1, "skipped", 3.0),
                                                (2, "loss", 1.5)]


def test_tensorboard_without_tensorboardx_says_what_to_install(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # the import fails
  with pytest.raises(ImportError, match=r"^train.tensorboard needs tensorboardX: pip install "
                                        r"tensorboardX$"):
    metrics_log.MetricsWriter(tmp_path, tensorboard=True)


ROW = {"step": 5, "loss": 1.23456, "lm_loss": 1.2, "aux_loss": 0.034567, "grad_norm": 0.5,
       "lr": 0.001, "tokens_per_s": 12345.0, "mfu": 0.4123}


def test_the_progress_line_shows_losses_rates_mfu_and_an_eta_from_the_pace_so_far():
  progress = metrics_log.Progress(total=10, start=0)
  progress.t0 = time.perf_counter() - 100  # 5 steps in 100 s: 5 more take 100 s
  assert progress.line(ROW) == ("[train] step 5/10  loss 1.2346 (lm 1.2000 aux 0.03457)  "
                                "|g| 0.5  lr 0.001  12.3k tok/s  MFU 41.2%  ETA 0:01:40")
  fp16 = {**ROW, "mfu": None, "loss_scale": 32768.0, "skipped_steps": 2}
  assert progress.line(fp16).endswith("12.3k tok/s  scale 32768 skipped 2  ETA 0:01:40")


def test_progress_before_any_step_of_a_resumed_run_has_no_eta():
  out = io.StringIO()
  progress = metrics_log.Progress(total=10, start=4, stream=out, prefix="eval")
  progress.message(4, "batches read")
  progress.show({**ROW, "step": 4})
  assert out.getvalue().splitlines() == [
      "[eval] 4/10 batches read  ETA ?",
      "[eval] step 4/10  loss 1.2346 (lm 1.2000 aux 0.03457)  |g| 0.5  lr 0.001  12.3k tok/s  "
      "MFU 41.2%  ETA ?"]


def test_only_the_first_call_of_each_key_is_timed_and_said():
  out = io.StringIO()
  first = metrics_log.FirstCalls("train", stream=out, total=2)
  calls = []
  step = first.wrap(lambda x: calls.append(x) or jnp.asarray(x) * 2, "step", "the step")
  assert int(step(3)) == 6 and int(step(4)) == 8
  with first.timed("eval", "the evaluation"):
    pass
  with first.timed("eval", "the evaluation"):
    pass
  assert calls == [3, 4] and set(first.seconds) == {"step", "eval"}
  lines = out.getvalue().splitlines()
  assert len(lines) == 4, lines
  assert lines[0] == "[train] compiling the step (1/2)..."
  assert re.fullmatch(r"\[train\] compiled the step in \d+\.\d s \(with its first run\)",
                      lines[1])
  assert lines[2] == "[train] compiling the evaluation (2/2)..."
  assert lines[3].startswith("[train] compiled the evaluation in ")
