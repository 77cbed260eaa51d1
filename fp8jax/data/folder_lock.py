"""One writer per output folder: an exclusive advisory lock on ``<folder>/.lock``.

    with folder_lock.hold(out):          # this process only
      ...

(:func:`fp8jax.train.multihost.lock_folder` is the same for a run of several processes:
process 0 alone holds the lock.)

The lock is ``fcntl.flock`` on ``<folder>/.lock``, which then holds a JSON record of the
holder (``host``, ``pid``, ``started``: UTC ISO time). A second writer fails at once with
:class:`FolderLockedError`, one line naming the folder and that holder. The kernel releases
the lock when its holder dies, however it dies (SIGKILL included), so a stale lock is never
left: the next writer takes it and overwrites the record. The file itself stays.

Reentrant within one thread: a nested :func:`hold` of a folder the thread already holds
(e.g. a notebook holding a folder around a call that takes it again) counts, and the
lock is released when the outermost ends. Other threads of the process are refused like
other processes. Folders nested in a held one (the study's ``train``, ``compare``) have
their own locks. Advisory: only code that takes the lock is kept out; flock on network
file systems is as reliable as the file system makes it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import pathlib
import socket
import threading
import time

LOCK_FILE = ".lock"
"""The lock file's name inside a locked folder."""

_held: dict[str, list] = {}  # resolved folder -> [fd, depth, thread id]
_guard = threading.Lock()


class FolderLockedError(RuntimeError):
  """Another writer (process, or thread of this process) holds the folder's lock."""


def holder(folder) -> dict | None:
  """The record of the folder's (last) holder, or None when there is none or it does not
  read (a holder that has not written it yet)."""
  try:
    record = json.loads((pathlib.Path(folder) / LOCK_FILE).read_text())
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) else None


def describe(record: dict | None) -> str:
  """``host H, pid P, started T`` of a holder record."""
  if not record:
    return "holder unknown"
  return (f"host {record.get('host', '?')}, pid {record.get('pid', '?')}, started "
          f"{record.get('started', '?')}")


def _refuse(folder: pathlib.Path) -> FolderLockedError:
  record = None
  for _ in range(20):  # the holder writes its record right after taking the lock
    record = holder(folder)
    if record:
      break
    time.sleep(0.01)
  return FolderLockedError(
      f"{folder} is in use by another run ({describe(record)}); wait for it to end or "
      "choose another folder")


def _acquire(folder: pathlib.Path) -> None:
  key = str(folder.resolve())
  with _guard:
    entry = _held.get(key)
    if entry is not None:
      if entry[2] != threading.get_ident():
        raise FolderLockedError(
            f"{folder} is in use by another thread of this process (pid {os.getpid()}); "
            "wait for it to end or choose another folder")
      entry[1] += 1
      return
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise _refuse(folder) from None
      raise
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    try:
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps(record).encode(), 0)
    except OSError as e:  # e.g. a full disk: the lock holds, the record is best effort
      if e.errno != errno.ENOSPC:
        os.close(fd)
        raise
    _held[key] = [fd, 1, threading.get_ident()]


def _release(folder: pathlib.Path) -> None:
  key = str(folder.resolve())
  with _guard:
    entry = _held[key]
    entry[1] -= 1
    if entry[1] == 0:
      del _held[key]
      os.close(entry[0])  # releases the flock


@contextlib.contextmanager
def hold(folder, create: bool = True):
  """Holds the exclusive lock of ``folder`` (created, parents too, if ``create``) for the
  ``with`` block.

  Raises:
    FolderLockedError: another process or thread holds it (the message names the folder
      and the holder: host, pid, start time).
    OSError: the folder cannot be created or the lock file not written (read-only, not a
      folder: the error names the path).
  """
  folder = pathlib.Path(folder)
  if create:
    folder.mkdir(parents=True, exist_ok=True)
  _acquire(folder)
  try:
    yield folder
  finally:
    _release(folder)
