"""`RoleSpecs`: one `QuantSpec` per operand role of a linear layer's GEMMs.

The three roles of the blockwise recipe, with their own amax epsilons (LoongForge's
``FP8_QUANT_FWD_INP_AMAX_EPS``, ``FP8_QUANT_FWD_WEIGHT_AMAX_EPS`` and
``FP8_QUANT_BWD_GRAD_AMAX_EPS``):

* ``input``: forward activations X [..., K];
* ``weight``: weights W [K, N];
* ``grad``: output gradients dY [..., N].
"""

from __future__ import annotations

import dataclasses

from fp8jax.numerics import granularity as gran
from fp8jax.numerics.spec import QuantSpec

ROLES = ("input", "weight", "grad")


@dataclasses.dataclass(frozen=True)
class RoleSpecs:
  """Frozen, hashable per-role specs."""

  input: QuantSpec
  weight: QuantSpec
  grad: QuantSpec

  def __post_init__(self):
    for role in ROLES:
      if not isinstance(getattr(self, role), QuantSpec):
        raise TypeError(f"role {role!r} needs a QuantSpec, got {getattr(self, role)!r}")

  def spec(self, role: str) -> QuantSpec:
    """The spec of ``role`` ("input", "weight" or "grad")."""
    if role not in ROLES:
      raise ValueError(f"unknown role {role!r}; roles are {ROLES}")
    return getattr(self, role)

  def with_amax_eps(self, input: float | None = None, weight: float | None = None,
                    grad: float | None = None) -> RoleSpecs:
    """A copy with the amax floor of each given role replaced."""
    changes = {}
    for role, eps in (("input", input), ("weight", weight), ("grad", grad)):
      if eps is not None:
        changes[role] = self.spec(role).replace(eps=eps)
    return dataclasses.replace(self, **changes)

  def replace_all(self, **spec_changes) -> RoleSpecs:
    """A copy with the same field changes applied to every role (e.g. format)."""
    return RoleSpecs(**{r: self.spec(r).replace(**spec_changes) for r in ROLES})


def deepseek_v3_roles(eps: float = 1e-12) -> RoleSpecs:
  """DeepSeek-V3: E4M3 everywhere, 1x128 tiles for X and dY, 128x128 blocks for W."""
  tile = QuantSpec(format="e4m3", granularity=gran.tile(128), eps=eps)
  return RoleSpecs(input=tile, weight=tile.replace(granularity=gran.block((128, 128))),
                   grad=tile)
