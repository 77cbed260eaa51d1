"""Precision policies: which named quantization sites of which layers are fake-quantized.

Sites (per layer):

==================  ==========================================================
``attn_out``        attention output after o_proj, before the residual add
``mlp_out``         dense-layer MLP output, before the residual add
``moe_out``         MoE block output (routed + shared), before the residual add
``moe_routed_out``  combined output of the routed experts
``moe_shared_out``  output of the shared experts
``expert_in``       the (normalised) input of the routed experts
==================  ==========================================================

A rule maps a site and a layer set ("0", "0-8", "1,3,5-7", "all") to a forward
:class:`fp8jax.QuantSpec`; the spec's ``backward`` quantizes the cotangent there (None:
straight-through). Every policy works on the same params tree.

``gemm`` (a :class:`fp8jax.GemmConfig`) routes the FP8 linear layers of the DeepSeek-V3
precision map through the simulated FP8 GEMM: the attention projections, the dense MLPs,
the shared experts and the routed experts (``fp8jax.grouped_gemm``, FP32 accumulation).
The embedding, head, router, norms and the attention core stay in high precision.
"""

from __future__ import annotations

import dataclasses

import fp8jax
from fp8jax import gemm as gemm_lib

SITES = ("attn_out", "mlp_out", "moe_out", "moe_routed_out", "moe_shared_out", "expert_in")


def parse_layers(text: str | int) -> tuple[int, ...] | None:
  """"all" -> None; "0-8" -> (0, ..., 8); "1,3,5-6" -> (1, 3, 5, 6); 2 -> (2,)."""
  if isinstance(text, int):
    return (text,)
  text = str(text).strip().lower()
  if text == "all":
    return None
  layers = []
  try:
    for part in text.split(","):
      lo, _, hi = part.partition("-")
      layers.extend(range(int(lo), int(hi or lo) + 1))
  except ValueError:
    raise ValueError(f"bad layer set {text!r}: use 'all', '0', '0-8' or '1,3,5-7'") from None
  if not layers or min(layers) < 0:
    raise ValueError(f"bad layer set {text!r}: no layers, or a negative layer")
  return tuple(sorted(set(layers)))


@dataclasses.dataclass(frozen=True)
class SiteRule:
  """Quantize ``site`` on ``layers`` (None = all) with ``spec``."""

  site: str
  layers: tuple[int, ...] | None
  spec: fp8jax.QuantSpec

  def __post_init__(self):
    if self.site not in SITES:
      raise ValueError(f"unknown quantization site {self.site!r}; sites: {SITES}")
    if not isinstance(self.spec, fp8jax.QuantSpec):
      raise TypeError(f"site {self.site}: spec must be a QuantSpec, got {self.spec!r}")
    if fp8jax.delayed.needs_state(self.spec):
      raise ValueError(f"site {self.site}: delayed scaling needs per-site state, which "
                       "model sites do not carry; use current scaling")


@dataclasses.dataclass(frozen=True)
class PrecisionPolicy:
  """A static, hashable set of site rules (later rules override earlier ones)."""

  rules: tuple[SiteRule, ...] = ()
  name: str = "bf16"
  gemm: gemm_lib.GemmConfig | None = None

  def __post_init__(self):
    if self.gemm is not None and not isinstance(self.gemm, gemm_lib.GemmConfig):
      raise TypeError(f"gemm must be an fp8jax GemmConfig or None, got {self.gemm!r}")
    if self.gemm is not None and self.gemm.accumulation.mode != "fp32":
      raise ValueError("the model's GEMM hook needs FP32 accumulation (the routed experts' "
                       "grouped GEMM has no tensor-core model); got "
                       f"{self.gemm.accumulation.describe()}")
    if self.gemm is not None and "fp8_native" in (self.gemm.fprop, self.gemm.dgrad,
                                                  self.gemm.wgrad):
      raise ValueError("the model's GEMM hook does not support fp8_native directions")

  def spec_for(self, site: str, layer: int) -> fp8jax.QuantSpec | None:
    spec = None
    for rule in self.rules:
      if rule.site == site and (rule.layers is None or layer in rule.layers):
        spec = rule.spec
    return spec

  def check_layers(self, num_layers: int) -> None:
    """Raises when a rule names a layer the model does not have."""
    for rule in self.rules:
      if rule.layers is not None and max(rule.layers) >= num_layers:
        raise ValueError(f"policy {self.name!r}: site {rule.site} names layer "
                         f"{max(rule.layers)} but the model has {num_layers} layers")


BF16 = PrecisionPolicy()


def site_policy(site: str, layers: str | int, spec: fp8jax.QuantSpec,
                name: str | None = None) -> PrecisionPolicy:
  """A one-rule policy, e.g. ``site_policy("attn_out", "0-8", fp8jax.preset(...))``."""
  parsed = parse_layers(layers)
  return PrecisionPolicy((SiteRule(site, parsed, spec),),
                         name or f"{site}@{layers}:{spec.format}")
