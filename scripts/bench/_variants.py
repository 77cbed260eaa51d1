"""Model variants the benchmarks can switch on to measure a lever before it is adopted."""

import functools

from fp8jax.models import moe


def fuse_gate_up() -> None:
  """Every BF16 MoE layer runs its routed experts' gate and up projections as one grouped
  GEMM of width 2f (``moe.experts_dispatch(..., fuse_gate_up=True)``), for this process."""
  moe.dispatch_groups = functools.partial(moe.dispatch_groups, fuse_gate_up=True)
