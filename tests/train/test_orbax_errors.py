"""How Orbax's failures reach the user (fp8jax/train/orbax_errors.py): a full or read-only disk
as one OSError naming the path, and the closed-event-loop noise of a failed restore dropped."""

import errno
import sys
import types

import pytest

from fp8jax.train import orbax_errors


@pytest.mark.parametrize("error, code", [
    (OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC),
    (OSError(errno.EDQUOT, "quota"), errno.EDQUOT),
    (RuntimeError("TensorStore write failed: Read-only file system [os error 30]"),
     errno.EROFS),
    (ValueError("OCDBT: No space left on device while flushing"), errno.ENOSPC)])
def test_a_full_or_read_only_disk_is_an_oserror_naming_the_path(error, code):
  with pytest.raises(OSError) as info:
    with orbax_errors.disk_errors("/runs/a/checkpoints/4"):
      raise error
  assert info.value.errno == code and info.value.filename == "/runs/a/checkpoints/4"
  assert info.value.__cause__ is error


def test_other_errors_pass_through_unchanged():
  error = ValueError("shape mismatch")
  with pytest.raises(ValueError) as info:
    with orbax_errors.disk_errors("/runs/a"):
      raise error
  assert info.value is error
  with orbax_errors.disk_errors("/runs/a"):
    pass  # no error, nothing raised


def test_only_the_closed_event_loop_message_is_dropped(monkeypatch):
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  orbax_errors.quiet_closed_loop_callbacks()
  hook = sys.unraisablehook
  orbax_errors.quiet_closed_loop_callbacks()
  assert sys.unraisablehook is hook  # wrapped once
  closed = types.SimpleNamespace(exc_value=RuntimeError("Event loop is closed"))
  other = types.SimpleNamespace(exc_value=RuntimeError("Event loop is running"))
  sys.unraisablehook(closed)
  sys.unraisablehook(other)
  assert seen == [other]
