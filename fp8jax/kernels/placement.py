"""When the ``"auto"`` implementations may pick a Pallas GPU kernel.

XLA cannot partition a kernel's custom call: under a multi-device mesh it would gather
the operands onto every device and repeat the work there. So ``"auto"`` takes a kernel
only on a GPU backend, and under a multi-device context mesh (``jax.set_mesh``; see
``fp8jax.train.mesh.under_mesh``) only where every axis is manual: inside a
``shard_map``, where each device runs its own program on its own data (the trainer's and
the paired evaluator's data-parallel replicas, :mod:`fp8jax.train.data_parallel`).
"""

from __future__ import annotations

import jax


def kernels_allowed(backend: str | None = None) -> bool:
  """Whether ``"auto"`` may use a Pallas GPU kernel here (at trace time)."""
  if (jax.default_backend() if backend is None else backend) != "gpu":
    return False
  mesh = jax.sharding.get_abstract_mesh()
  return (mesh.empty or mesh.size == 1
          or all(t == jax.sharding.AxisType.Manual for t in mesh.axis_types))


def capability_at_least(major: int, minor: int = 0) -> bool:
  """Whether the first device is a CUDA GPU of compute capability (major, minor) or newer."""
  cc = compute_capability()
  return cc is not None and cc >= (major, minor)


def compute_capability() -> tuple[int, int] | None:
  """(major, minor) of the first device when it is a CUDA GPU, else None."""
  cc = getattr(jax.devices()[0], "compute_capability", None)
  try:
    major, minor = str(cc).split(".")[:2]
    return int(major), int(minor)
  except ValueError:
    return None
