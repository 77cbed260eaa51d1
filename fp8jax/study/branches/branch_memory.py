"""Device and host memory of branch-off runs: how many branches are stepped together, and
a checkpoint's train state kept in host memory between its groups of branches.

A group of branches trains beside its own pass of the BF16 reference, from the same
restored checkpoint. When a checkpoint's branches do not all fit on the devices at once,
every further group needs the restored state again: :class:`RestoredState` keeps it in
pinned host memory after the first group, so that it is copied back (a PCIe transfer)
rather than read and verified from disk again.
"""

from __future__ import annotations

import os
import pathlib

import jax
import numpy as np

HEADROOM = 0.9
"""The share of a device's memory limit that the branches' buffers may fill: the compiled
step's own temporary memory is counted exactly, what is left covers fragmentation."""


def state_bytes(tree, devices: int, fsdp: bool) -> int:
  """Bytes of ``tree`` (arrays or ShapeDtypeStructs) held on one device: all of it, or a
  ``devices``-th share of it when the state is split over the devices (FSDP)."""
  total = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))
  return total // devices if fsdp else total


def auto_together(abstract, mesh, fsdp: bool, step_temp_bytes: int | None = None,
                  headroom: float = HEADROOM) -> int | None:
  """How many branches besides the reference fit at once on a device (None: no memory
  figure, e.g. CPU: all).

  Each branch and the reference hold a train state (``abstract``) and, across their step,
  a copy of their params (the params before the update, for the update cosine). The step
  needs ``step_temp_bytes`` of temporary memory on top (the compiled step's own figure,
  the largest of the policies' steps); without it, one more train state is reserved.
  """
  stats = mesh.devices.flat[0].memory_stats() or {}
  limit = stats.get("bytes_limit")
  if not limit:
    return None
  n = mesh.devices.size
  branch = state_bytes(abstract, n, fsdp) + state_bytes(abstract.params, n, fsdp)
  temp = state_bytes(abstract, n, fsdp) if step_temp_bytes is None else step_temp_bytes
  free = headroom * limit - branch - temp
  return max(1, int(free // branch))


def temp_bytes(compiled) -> int | None:
  """The temporary memory a compiled program needs per device (None: not reported)."""
  try:
    analysis = compiled.memory_analysis()
  except (NotImplementedError, AttributeError, RuntimeError):
    return None
  return None if analysis is None else int(analysis.temp_size_in_bytes)


def host_sharding(sharding):
  """``sharding`` (a pytree of shardings) placed in pinned host memory; None where a
  sharding has no host memory kind on its platform."""
  try:
    return jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), sharding)
  except (ValueError, AttributeError, NotImplementedError):
    return None


def host_bytes_available(meminfo: str = "/proc/meminfo") -> int | None:
  """The host memory available now for a new allocation, in bytes: Linux's
  ``MemAvailable``, which counts the page cache the kernel can drop (a checkpoint just
  read sits there); elsewhere the free pages; None: unknown."""
  try:
    for line in pathlib.Path(meminfo).read_text().splitlines():
      if line.startswith("MemAvailable:"):
        value, unit = line.split()[1:3]
        return int(value) * {"kB": 1024}.get(unit, 1)
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return None


def fits_in_host(tree, share: float = 0.5) -> bool:
  """Whether this process's shards of ``tree`` (every device's copy of a replicated array
  counts) fit in ``share`` of the host memory available now."""
  available = host_bytes_available()
  held = sum(int(np.prod(s.data.shape)) * np.dtype(s.data.dtype).itemsize
             for a in jax.tree.leaves(tree) for s in a.addressable_shards)
  return available is not None and held <= share * available


class RestoredState:
  """A checkpoint's restored train state, handed to each of its groups of branches.

  The first :meth:`take` returns the restored state itself. When more groups follow and
  ``keep`` allows, a copy is first put in pinned host memory, and every later
  :meth:`take` copies it back to the devices in ``sharding``; otherwise a later ``take``
  calls ``reread`` (the checkpoint read and verified again). ``copied`` says which.
  """

  def __init__(self, state, sharding, groups: int, reread, keep: bool = True):
    self._state, self._sharding, self._reread, self._host = state, sharding, reread, None
    host = host_sharding(sharding) if keep and groups > 1 else None
    if host is not None and fits_in_host(state):
      self._host = jax.block_until_ready(jax.device_put(state, host))
    self.copied = self._host is not None

  def take(self):
    """The train state on the devices, for one group (its buffers are the caller's)."""
    if self._state is not None:
      state, self._state = self._state, None
      return state
    if self._host is not None:
      return jax.device_put(self._host, self._sharding)
    return self._reread()
