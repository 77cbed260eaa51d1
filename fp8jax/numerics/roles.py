"""`RoleSpecs`: one `QuantSpec` per operand role of a linear layer's GEMMs, and optionally
one per copy of an operand that a backward GEMM reads.

The three roles of the blockwise recipe, with their own amax epsilons (LoongForge's
``FP8_QUANT_FWD_INP_AMAX_EPS``, ``FP8_QUANT_FWD_WEIGHT_AMAX_EPS`` and
``FP8_QUANT_BWD_GRAD_AMAX_EPS``):

* ``input``: forward activations X [..., K];
* ``weight``: weights W [K, N];
* ``grad``: output gradients dY [..., N].

Each tensor enters two GEMMs, so a layer quantizes six operand copies (:data:`COPIES`):
X and W for Fprop, dY and W^T for Dgrad, X^T and dY^T for Wgrad. A role's spec quantizes
both copies of its tensor unless the second copy has its own spec (``dgrad_weight`` for
W^T, ``wgrad_input`` for X^T, ``wgrad_grad`` for dY^T; None: the role's): Transformer
Engine's ``CustomRecipe`` with a ``HybridQuantizer`` per tensor (PR #2817), whose
rowwise quantizer serves the first GEMM and columnwise quantizer the second.
"""

from __future__ import annotations

import dataclasses

from fp8jax.numerics import granularity as gran
from fp8jax.numerics.spec import QuantSpec

ROLES = ("input", "weight", "grad")
COPIES = {("fprop", "input"): "input", ("fprop", "weight"): "weight",
          ("dgrad", "grad"): "grad", ("dgrad", "weight"): "dgrad_weight",
          ("wgrad", "input"): "wgrad_input", ("wgrad", "grad"): "wgrad_grad"}
"""(GEMM, role) of each of the six operand copies -> the field that holds its spec."""
OVERRIDES_OF = {"dgrad_weight": "weight", "wgrad_input": "input", "wgrad_grad": "grad"}
"""The fields of the second copies -> the role whose spec each defaults to."""
OVERRIDES = tuple(OVERRIDES_OF)
"""The fields of the second copies."""


@dataclasses.dataclass(frozen=True)
class RoleSpecs:
  """Frozen, hashable per-role specs, and optional specs of the backward copies."""

  input: QuantSpec
  weight: QuantSpec
  grad: QuantSpec
  dgrad_weight: QuantSpec | None = None
  wgrad_input: QuantSpec | None = None
  wgrad_grad: QuantSpec | None = None

  def __post_init__(self):
    for role in ROLES:
      if not isinstance(getattr(self, role), QuantSpec):
        raise TypeError(f"role {role!r} needs a QuantSpec, got {getattr(self, role)!r}")
    for name in OVERRIDES:
      if getattr(self, name) is not None and not isinstance(getattr(self, name), QuantSpec):
        raise TypeError(f"{name} needs a QuantSpec or None (the {OVERRIDES_OF[name]} "
                        f"role's), got {getattr(self, name)!r}")

  def spec(self, role: str) -> QuantSpec:
    """The spec of ``role`` ("input", "weight" or "grad")."""
    if role not in ROLES:
      raise ValueError(f"unknown role {role!r}; roles are {ROLES}")
    return getattr(self, role)

  def operand(self, gemm: str, role: str) -> QuantSpec:
    """The spec of the copy of ``role`` that ``gemm`` ("fprop", "dgrad", "wgrad") reads:
    its own where set, else the role's."""
    name = COPIES.get((gemm, role))
    if name is None:
      raise ValueError(f"{gemm} reads no {role!r} operand; the copies are "
                       f"{sorted(COPIES)}")
    own = getattr(self, name)
    return own if own is not None else getattr(self, OVERRIDES_OF.get(name, name))

  def specs(self) -> tuple[QuantSpec, ...]:
    """Every spec it holds: the three roles', then the copies' that are set."""
    return tuple(s for s in (getattr(self, f) for f in (*ROLES, *OVERRIDES)) if s is not None)

  def map(self, fn) -> RoleSpecs:
    """A copy with ``fn(spec)`` in place of every spec it holds (unset copies stay unset)."""
    return dataclasses.replace(self, **{f: fn(getattr(self, f)) for f in (*ROLES, *OVERRIDES)
                                        if getattr(self, f) is not None})

  def with_amax_eps(self, input: float | None = None, weight: float | None = None,
                    grad: float | None = None) -> RoleSpecs:
    """A copy with the amax floor of each given role (both of its copies) replaced."""
    changes = {}
    for role, eps in (("input", input), ("weight", weight), ("grad", grad)):
      if eps is None:
        continue
      for name in (role, *(o for o in OVERRIDES if OVERRIDES_OF[o] == role)):
        if getattr(self, name) is not None:
          changes[name] = getattr(self, name).replace(eps=eps)
    return dataclasses.replace(self, **changes)

  def replace_all(self, **spec_changes) -> RoleSpecs:
    """A copy with the same field changes applied to every spec (e.g. format)."""
    return self.map(lambda s: s.replace(**spec_changes))


def deepseek_v3_roles(eps: float = 1e-12) -> RoleSpecs:
  """DeepSeek-V3: E4M3 everywhere, 1x128 tiles for X and dY, 128x128 blocks for W."""
  tile = QuantSpec(format="e4m3", granularity=gran.tile(128), eps=eps)
  return RoleSpecs(input=tile, weight=tile.replace(granularity=gran.block((128, 128))),
                   grad=tile)
