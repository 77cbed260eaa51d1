"""Preemption: a SIGTERM makes a run save at the next step boundary and stop.

Schedulers (SLURM, Kubernetes, Cloud TPU maintenance) announce the end of a job with
SIGTERM and a grace period. In a multi-process run (``jax.distributed``), JAX's preemption
service catches the signal on whichever process receives it and agrees with the others on
a step at which all of them stop; Orbax asks it with ``reached_preemption(step)``. A
single process has no such service: :class:`Watch` then installs a SIGTERM handler for the
duration of the run. Either way the loop saves a checkpoint at that step and raises
:class:`Preempted`; the binaries exit with :data:`EXIT_CODE`, and ``--resume`` continues
exactly.
"""

from __future__ import annotations

import signal
import threading

import jax

EXIT_CODE = 75
"""Exit status of a preempted run (``EX_TEMPFAIL``: stopped cleanly, run it again)."""


class Preempted(RuntimeError):
  """The run saved a checkpoint at ``step`` after a preemption notice and stopped."""

  def __init__(self, step: int, directory):
    super().__init__(f"preempted: saved checkpoint {step} in {directory} and stopped; "
                     "rerun with --resume to continue")
    self.step = step


class Watch:
  """Whether a preemption notice arrived, asked once per step by every process.

  Use as a context manager around the training loop: in a single process it installs a
  SIGTERM handler (the main thread only) and restores the previous one on exit.

  Args:
    manager: the run's ``orbax.checkpoint.CheckpointManager``.
  """

  def __init__(self, manager):
    self.manager = manager
    self.signalled = False
    self._installed, self._previous = False, None

  def __enter__(self) -> Watch:
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
      self._installed = True
    return self

  def __exit__(self, *exc) -> None:
    if self._installed:  # a handler set outside Python reads as None: the default then
      signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)
      self._installed = False

  def _handle(self, signum, frame) -> None:
    del signum, frame
    self.signalled = True

  def reached(self, step: int) -> bool:
    """Whether to save at ``step`` and stop (the same answer on every process).

    Re-installs the SIGTERM handler first: a native library loaded during the run may
    replace it behind Python's back (on an H100 a SIGTERM once reached a C++ failure-signal
    handler, which aborted the run, instead of this one), and Python cannot see that."""
    if self._installed:
      signal.signal(signal.SIGTERM, self._handle)
    return self.manager.reached_preemption(step) or self.signalled
