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
the shared experts and the routed experts (``fp8jax.gemm.grouped``, FP32 accumulation).
The embedding, head, router, norms and the attention core stay in high precision.
"""

from __future__ import annotations

import dataclasses
import re

import fp8jax
from fp8jax.gemm import dense as gemm_lib

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
    if fp8jax.quant.delayed.needs_state(self.spec):
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

  def check_layers(self, num_layers: int, is_moe_layer=None) -> None:
    """Raises when a rule names a layer the model does not have or, given
    ``is_moe_layer(i)``, an MoE site on a dense layer (or ``mlp_out`` on an MoE layer)."""
    for rule in self.rules:
      if rule.layers is not None and max(rule.layers) >= num_layers:
        raise ValueError(f"policy {self.name!r}: site {rule.site} names layer "
                         f"{max(rule.layers)} but the model has {num_layers} layers")
      if is_moe_layer is None or rule.layers is None:
        continue
      for i in rule.layers:
        if rule.site != "attn_out" and (rule.site == "mlp_out") == is_moe_layer(i):
          kind = "an MoE" if is_moe_layer(i) else "a dense"
          raise ValueError(f"policy {self.name!r}: site {rule.site} does not exist at layer "
                           f"{i}, which is {kind} layer")


BF16 = PrecisionPolicy()


def site_policy(site: str, layers: str | int, spec: fp8jax.QuantSpec,
                name: str | None = None) -> PrecisionPolicy:
  """A one-rule policy, e.g. ``site_policy("attn_out", "0-8", fp8jax.preset(...))``."""
  parsed = parse_layers(layers)
  return PrecisionPolicy((SiteRule(site, parsed, spec),),
                         name or f"{site}@{layers}:{spec.format}")


# --- policy expressions ------------------------------------------------------------

SITE_ALIASES = {"attn": "attn_out", "moe": "moe_out", "mlp": "mlp_out",
                "routed": "moe_routed_out", "shared": "moe_shared_out"}
GRANULARITIES = {"tensor": fp8jax.per_tensor,
                 "channel": lambda: fp8jax.per_axis(-1),
                 "1x128": lambda: fp8jax.tile(128),
                 "128x128": lambda: fp8jax.block((128, 128))}
GEMMS = {"fp32_blockwise": gemm_lib.FP32_BLOCKWISE}


def parse_spec(text: str) -> fp8jax.QuantSpec:
  """A preset name (``deepseek_v3``), or ``FORMAT[/GRANULARITY]``: ``e4m3``,
  ``e5m2/1x128`` (granularity ``tensor`` (default), ``channel``, ``1x128``, ``128x128``;
  current scaling, FP32 scales, straight-through backward)."""
  text = text.strip()
  if text in fp8jax.PRESETS:
    return fp8jax.preset(text)
  fmt, _, gran = text.partition("/")
  if fmt not in fp8jax.FORMATS:
    raise ValueError(f"unknown spec {text!r}: use a preset {sorted(fp8jax.PRESETS)} or "
                     f"FORMAT[/GRANULARITY] with a format in {sorted(fp8jax.FORMATS)}")
  gran = gran or "tensor"
  if gran not in GRANULARITIES:
    raise ValueError(f"unknown granularity {gran!r} in {text!r}; known: {sorted(GRANULARITIES)}")
  return fp8jax.QuantSpec(format=fmt, granularity=GRANULARITIES[gran]())


def parse_policy(expr: str) -> PrecisionPolicy:
  """A policy from an expression: ``bf16``, a grid name ``{attn,moe}_l<LAYERS>_{e4m3,e5m2}``
  (:func:`seed_grid`, e.g. ``moe_l0-8_e4m3``), or
  terms joined by ``+``: ``SITE@LAYERS:SPEC`` (SITE one of :data:`SITES` or an alias in
  :data:`SITE_ALIASES`; LAYERS as in :func:`parse_layers`; SPEC as in
  :func:`parse_spec`) and ``gemm:fp32_blockwise`` (the DeepSeek-V3 GEMM recipe).

  Example: ``attn@0-8:e4m3+moe@0:deepseek_v3+gemm:fp32_blockwise``.
  """
  expr = expr.strip()
  grid = _GRID_NAME.match(expr)
  if grid:
    module, layers, fmt = grid.groups()
    return dataclasses.replace(parse_policy(f"{module}@{layers}:{fmt}"), name=expr)
  if expr.lower() == "bf16":
    return BF16
  rules, gemm = [], None
  for term in filter(None, (t.strip() for t in expr.split("+"))):
    if term.startswith("gemm:"):
      name = term[len("gemm:"):]
      if name not in GEMMS:
        raise ValueError(f"unknown GEMM recipe {name!r} in {expr!r}; known: {sorted(GEMMS)}")
      gemm = GEMMS[name]
      continue
    site, at, rest = term.partition("@")
    layers, colon, spec = rest.partition(":")
    if not (at and colon):
      raise ValueError(f"bad policy term {term!r} in {expr!r}: use SITE@LAYERS:SPEC, "
                       "gemm:NAME, 'bf16' or a seed-grid name "
                       f"{sorted(SEED_GRID)}")
    rules.append(SiteRule(SITE_ALIASES.get(site, site), parse_layers(layers), parse_spec(spec)))
  if not rules and gemm is None:
    raise ValueError(f"empty policy expression {expr!r}")
  return PrecisionPolicy(tuple(rules), expr, gemm)


def seed_grid(num_layers: int = 9) -> dict[str, str]:
  """The seed study's grid: {attention, MoE} output x {layer 0, layers 0..L-1} x
  {E4M3, E5M2}, activations only (per-tensor current scaling, straight-through
  backward). For the 2B model (9 layers) the depths are "0" and "0-8"."""
  return {f"{module}_l{layers}_{fmt}": f"{module}@{layers}:{fmt}"
          for module in ("attn", "moe") for layers in ("0", f"0-{num_layers - 1}")
          for fmt in ("e4m3", "e5m2")}


SEED_GRID = seed_grid(9)

GRIDS = {"seed": seed_grid}
"""Named policy grids: ``{name: f(num_layers) -> {policy name: expression}}``. A sweep's
``--policies=NAME`` expands to the grid of the model's depth."""

_GRID_NAME = re.compile(r"^(attn|moe)_l(\d+(?:-\d+)?)_(e4m3|e5m2)$")
