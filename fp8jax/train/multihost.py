"""Several processes, one program: JAX's multi-controller runtime for training and studies.

Every process runs the same program over one global mesh; each feeds its own share of the
batch and holds the arrays of its own devices. :func:`initialize` joins such a run
(``jax.distributed.initialize``); the rest keeps the processes in step and the outputs
single:

* only process 0 (:func:`is_main`) writes files outside checkpoints and prints progress
  (:func:`main_stream`); Orbax writes each checkpoint once, from every process's shards;
* decisions that lead to collectives are the same on every process: :func:`any_process`
  (one process failed, so all take that branch) and :func:`broadcast` (process 0's
  answer, e.g. which results are still missing);
* :func:`barrier` orders a file change by process 0 before the others read.

In a single process every helper is local and free. :func:`start` is what the binaries
call first: it joins the run when asked and keeps library INFO logs off the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib

import jax
from jax.experimental import multihost_utils
import numpy as np

from fp8jax.data import folder_lock

ENV_NUM_PROCESSES, ENV_PROCESS_ID = "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
"""With ``JAX_COORDINATOR_ADDRESS`` (host:port of process 0, read by JAX itself), the
environment of a launch that JAX does not detect (``scripts/launch_local.py``, a GKE pod
spec): the number of processes and this process's index."""


def initialize() -> None:
  """``jax.distributed.initialize()`` from the environment.

  A cluster that JAX detects (SLURM, Cloud TPU VMs and GKE TPU node pools, Open MPI,
  Kubernetes with the ``kubernetes`` package) needs nothing more. Otherwise
  ``JAX_COORDINATOR_ADDRESS``, :data:`ENV_NUM_PROCESSES` and :data:`ENV_PROCESS_ID` name
  the run. CPU processes need ``JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo`` for collectives.

  Raises:
    ValueError: only part of the explicit environment is set, a value is not an integer
      (the message names the variable), or neither a cluster nor the environment names
      the run.
  """
  explicit = {name: os.environ.get(name) for name in (ENV_NUM_PROCESSES, ENV_PROCESS_ID)}
  given = {k: v for k, v in explicit.items() if v not in (None, "")}
  if given and len(given) < len(explicit):
    missing = sorted(set(explicit) - set(given))
    raise ValueError(f"{', '.join(sorted(given))} is set but {', '.join(missing)} is not: "
                     "a multi-process launch sets both (with JAX_COORDINATOR_ADDRESS)")
  kwargs = {}
  for name, key in ((ENV_NUM_PROCESSES, "num_processes"), (ENV_PROCESS_ID, "process_id")):
    if name in given:
      try:
        kwargs[key] = int(given[name])
      except ValueError:
        raise ValueError(f"{name}={given[name]!r} is not an integer") from None
  try:
    jax.distributed.initialize(**kwargs)
  except ValueError as e:  # JAX's message names one missing value, not what to set
    raise ValueError(f"--distributed: jax.distributed.initialize(): {e} Outside a cluster "
                     "that JAX detects (SLURM, Cloud TPU, Open MPI, Kubernetes), set "
                     "JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and "
                     "JAX_PROCESS_ID, or start the processes with scripts/launch_local.py"
                     ) from None


def quiet_library_logs(verbosity_given: bool) -> None:
  """Keeps library INFO logs (Orbax, absl, JAX) off the terminal: Python logging at
  WARNING unless the binary's ``--verbosity`` was given. Warnings still show."""
  if not verbosity_given:
    from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel

    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)


def start(distributed: bool, verbosity_given: bool) -> None:
  """The start of a binary's ``main``: :func:`quiet_library_logs`, then
  :func:`initialize` if ``distributed`` (the ``--distributed`` flag)."""
  quiet_library_logs(verbosity_given)
  if distributed:
    initialize()


def is_main() -> bool:
  """Whether this is process 0, the one that writes results and prints progress."""
  return jax.process_index() == 0


class _Sink:
  """A text stream that drops everything (the progress of processes other than 0)."""

  def write(self, text: str) -> int:
    return len(text)

  def flush(self) -> None:
    pass


def main_stream(stream):
  """``stream`` on process 0, a sink elsewhere."""
  return stream if is_main() else _Sink()


def any_process(flag: bool) -> bool:
  """Whether ``flag`` is true on any process (every process must call it)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.any(multihost_utils.process_allgather(np.int32(bool(flag)))))


def total(value: int) -> int:
  """The sum of ``value`` over the processes (every process must call it)."""
  if jax.process_count() == 1:
    return int(value)
  return int(np.sum(multihost_utils.process_allgather(np.int32(value))))


def broadcast(value: np.ndarray) -> np.ndarray:
  """Process 0's ``value`` on every process (same shape and dtype everywhere)."""
  if jax.process_count() == 1:
    return np.asarray(value)
  return np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(value)))


def barrier(name: str) -> None:
  """Waits until every process reached the barrier ``name``."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def lock_folder(folder, create: bool = True):
  """:func:`fp8jax.data.folder_lock.hold` for a run of one or several processes: process 0
  alone takes the lock of ``folder``, and every process raises if it could not, so that
  all stop together before any collective.

  Raises:
    fp8jax.data.folder_lock.FolderLockedError: another run holds the folder.
    OSError: process 0 cannot create the folder or its lock file.
  """
  stack, error = contextlib.ExitStack(), None
  with stack:
    if is_main():
      try:
        stack.enter_context(folder_lock.hold(folder, create))
      except (folder_lock.FolderLockedError, OSError) as e:
        error = e
    if any_process(error is not None):
      raise error or folder_lock.FolderLockedError(
          f"{folder}: process 0 of the run could not lock it (its error)")
    yield pathlib.Path(folder)
