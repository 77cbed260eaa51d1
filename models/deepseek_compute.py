"""How DeepSeek-MoE's forward pass computes and what it reports (not what it computes):
:class:`Compute`, the one record its layers read (``deepseek_moe.apply(..., compute=...)``,
or its fields by name)."""

from __future__ import annotations

import dataclasses

DISPATCH_IMPLS = ("dispatch", "pallas")
"""The sorted dropless MoE paths."""
MOE_IMPLS = (*DISPATCH_IMPLS, "reference")
"""Every MoE path (``reference``: every expert on every token)."""


@dataclasses.dataclass(frozen=True)
class Compute:
  """How a forward pass computes and what it reports, not what it computes: the one
  record the layers read (``deepseek_moe.apply`` takes its fields by name too).

  Attributes:
    moe_impl: the routed experts' path, one of :data:`MOE_IMPLS`: "dispatch" (sorted
      dropless through XLA), "pallas" (sorted dropless through the Pallas grouped GEMM:
      GPU) or "reference" (every expert).
    moe_groups: dispatch the MoE per group of B / moe_groups sequences
      (:class:`fp8jax.models.deepseek_moe.MoE`).
    deterministic: the same bits on every GPU run (:mod:`fp8jax.train.determinism`): a
      one-hot GEMM for the embedding's gradient, XLA's attention for cuDNN's.
    telemetry: also return per-site quantization telemetry (``aux["telemetry"]``).
    gemm_telemetry: also return the block-scale telemetry sums of the GEMM recipe's
      forward operands (:mod:`fp8jax.gemm.operand_telemetry`), as
      ``aux["gemm_telemetry"]``: ``{"layers/<i>/<module path>": {"input": sums, "weight":
      sums}}`` (routed experts: ``layers/<i>/mlp/experts``, ``weight_gate|up|down``);
      empty without a GEMM recipe.
  """
  moe_impl: str = "dispatch"
  moe_groups: int = 1
  deterministic: bool = False
  telemetry: bool = False
  gemm_telemetry: bool = False

  def __post_init__(self):
    if self.moe_impl not in MOE_IMPLS:
      raise ValueError(f"unknown MoE implementation {self.moe_impl!r}; use one of "
                       f"{MOE_IMPLS}")
    if int(self.moe_groups) < 1:
      raise ValueError(f"moe_groups must be >= 1, got {self.moe_groups}")

  @classmethod
  def of(cls, compute: Compute | None = None, **fields) -> Compute:
    """``compute`` (default :class:`Compute`) with ``fields`` replaced; a name that is not
    a field is refused (TypeError)."""
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise TypeError(f"unknown forward option(s) {unknown}; DeepSeek-MoE's are "
                      f"{[f.name for f in dataclasses.fields(cls)]}")
    return dataclasses.replace(compute or cls(), **fields)


DEFAULT = Compute()
"""The default: XLA's dispatch, one group, no deterministic mode, no telemetry."""
