"""How Orbax's failures reach the user: a full or read-only disk as one OSError naming the
path (:func:`disk_errors`), and without the page of closed-event-loop tracebacks that a
failed restore leaves behind (:func:`quiet_closed_loop_callbacks`)."""

import contextlib
import errno
import sys


@contextlib.contextmanager
def disk_errors(path):
  """A full or read-only disk met while saving (an OSError, or an error of Orbax or
  TensorStore saying so) as an OSError naming ``path``."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    text = str(e)
    for code, words in ((errno.ENOSPC, "No space left on device"),
                        (errno.EROFS, "Read-only file system"),
                        (errno.EDQUOT, "Disk quota exceeded")):
      if getattr(e, "errno", None) == code or words in text:
        raise OSError(code, words, str(path)) from e
    raise


def quiet_closed_loop_callbacks() -> None:
  """Drops the ``RuntimeError('Event loop is closed')`` that a failed restore leaves.

  Orbax abandons the TensorStore reads still in flight when one fails; as they finish they
  schedule callbacks on the restore's event loop, already closed, and Python reports each
  as an unraisable exception (a page of tracebacks around the clear error). Before the
  first restore, this wraps ``sys.unraisablehook`` once to drop that one message;
  everything else passes through.
  """
  previous = sys.unraisablehook
  if getattr(previous, "quiets_closed_loop", False):
    return

  def hook(unraisable):
    exc = unraisable.exc_value
    if not (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"):
      previous(unraisable)

  hook.quiets_closed_loop = True
  sys.unraisablehook = hook
