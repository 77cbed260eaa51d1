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
straight-through). Every policy works on the same params tree. A spec with delayed
scaling (``attn@0:e4m3/delayed(h=1024,reduce=max,margin=0)``, the ``te_hybrid`` preset)
reads and updates a per-site amax history: see :mod:`fp8jax.models.delayed_sites`.

``gemm`` (a :class:`fp8jax.GemmConfig`, e.g. a recipe of ``fp8jax.gemm.recipes``) routes
the FP8 linear layers of the DeepSeek-V3 precision map through the simulated low-precision
GEMM: the attention projections, the dense MLPs, the shared experts and the routed experts
(``fp8jax.gemm.grouped``), on the layers ``gemm_layers`` (None: all)
except the last ``gemm_bf16_tail`` share of the model's layers, which stay in BF16 (the
NVFP4 recipe's BF16 layers). The embedding, head, router, norms and the attention core
stay in high precision.

The model asks the rule engine (:mod:`fp8jax.rules`) for these decisions:
:meth:`PrecisionPolicy.to_rules` compiles a policy to rules over paths, a site being the
named point ``layers/{i}/{site}`` and the GEMM recipe applying to the linear layers'
module paths (:mod:`fp8jax.models.policy_rules`).

:func:`record` describes a policy completely as JSON (every rule and GEMM recipe with all
QuantSpec fields, epsilons included); training checkpoints store it, so a resume can tell
whether it continues under the same policy.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import json
import re
from typing import ClassVar

import fp8jax
from fp8jax import rules as fp8jax_rules
from fp8jax.gemm import dense as gemm_lib
from fp8jax.gemm import recipes
from fp8jax.models import policy_grid, policy_rules
from fp8jax.numerics.formats import FORMATS
from fp8jax.numerics.presets import PRESETS
from fp8jax.numerics.roles import OVERRIDES

SITE_MODULES = {
    "attn_out": ("attn_o",), "mlp_out": ("dense_mlp",),
    "moe_out": ("routed_experts", "shared_experts"), "moe_routed_out": ("routed_experts",),
    "moe_shared_out": ("shared_experts",), "expert_in": ("routed_experts",)}
"""The sites (module docstring), each with the modules (:data:`fp8jax.models.param_paths.MODULES`)
whose parameters see its quantized tensor directly: the one list of the model's sites."""
SITES = tuple(SITE_MODULES)
MOE_SITES = tuple(s for s in SITES if s not in ("attn_out", "mlp_out"))
"""The sites of MoE layers (``attn_out`` runs in every layer, ``mlp_out`` in dense ones)."""


MAX_LAYER = 9999
"""The largest layer index a policy may name (the model then checks its own depth)."""


def parse_layers(text: str | int) -> tuple[int, ...] | None:
  """"all" -> None; "0-8" -> (0, ..., 8); "1,3,5-6" -> (1, 3, 5, 6); 2 -> (2,). Indices
  above :data:`MAX_LAYER` are refused before any set is built."""
  if isinstance(text, int):
    text = str(text)
  text = str(text).strip().lower()
  if text == "all":
    return None
  layers = []
  try:
    for part in text.split(","):
      lo, _, hi = part.partition("-")
      lo, hi = int(lo), int(hi or lo)
      if max(lo, hi) > MAX_LAYER:
        raise OverflowError
      layers.extend(range(lo, hi + 1))
  except ValueError:
    raise ValueError(f"bad layer set {text!r}: use 'all', '0', '0-8' or '1,3,5-7'") from None
  except OverflowError:
    raise ValueError(f"bad layer set {text!r}: layer indices go up to {MAX_LAYER} (the "
                     "model then checks its own number of layers)") from None
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


@dataclasses.dataclass(frozen=True)
class PrecisionPolicy:
  """A static, hashable set of site rules (later rules override earlier ones)."""

  site_modules: ClassVar[Mapping[str, tuple[str, ...]]] = SITE_MODULES
  """What ``fp8jax.models.param_paths.direct_modules`` reads: the modules each site quantizes."""

  rules: tuple[SiteRule, ...] = ()
  name: str = "bf16"
  gemm: gemm_lib.GemmConfig | None = None
  gemm_layers: tuple[int, ...] | None = None
  gemm_bf16_tail: float = 0.0

  def __post_init__(self):
    if not 0.0 <= self.gemm_bf16_tail < 1.0:
      raise ValueError(f"gemm_bf16_tail is a share of the layers in [0, 1), got "
                       f"{self.gemm_bf16_tail}")
    if self.gemm is not None and not isinstance(self.gemm, gemm_lib.GemmConfig):
      raise TypeError(f"gemm must be an fp8jax GemmConfig or None, got {self.gemm!r}")
    if self.gemm is not None and "fp8_native" in (self.gemm.fprop, self.gemm.dgrad,
                                                  self.gemm.wgrad):
      raise ValueError("the model's GEMM hook does not support fp8_native directions")

  def bf16_tail_layers(self, num_layers: int) -> int:
    """How many final layers keep BF16 GEMMs (:func:`fp8jax.gemm.recipes.bf16_tail_layers`)."""
    return recipes.bf16_tail_layers(self.gemm_bf16_tail, num_layers)

  def to_rules(self, num_layers: int) -> fp8jax_rules.Rules:
    """The policy as rules of the engine on a model of ``num_layers`` layers: the sites
    as named points ``layers/{i}/{site}``, the GEMM recipe on the linear layers' module
    paths (:mod:`fp8jax.models.policy_rules`)."""
    return policy_rules.policy_rules(self, num_layers)

  def at_layer(self, layer: int, num_layers: int) -> PrecisionPolicy:
    """The policy as layer ``layer`` of ``num_layers`` applies it: without its GEMM where
    the rules give the layer's linear layers none."""
    if self.gemm is None:
      return self
    rules = self.to_rules(num_layers)
    if fp8jax_rules.gemm_config(rules, f"layers/{layer}/self_attn/q_proj") is None:
      return dataclasses.replace(self, gemm=None, gemm_layers=None, gemm_bf16_tail=0.0)
    return self

  def spec_for(self, site: str, layer: int) -> fp8jax.QuantSpec | None:
    """The spec of ``site`` at ``layer`` (None: not quantized), from the site rules."""
    return fp8jax_rules.output_spec(policy_rules.site_rules(self.rules),
                                    policy_rules.site_path(site, layer))

  def check_layers(self, num_layers: int, is_moe_layer=None) -> None:
    """Raises when a rule names a layer the model does not have or, given
    ``is_moe_layer(i)``, an MoE site on a dense layer (or ``mlp_out`` on an MoE layer)."""
    if self.gemm_layers is not None and max(self.gemm_layers) >= num_layers:
      raise ValueError(f"policy {self.name!r}: the GEMM recipe names layer "
                       f"{max(self.gemm_layers)} but the model has {num_layers} layers")
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


def record(policy: PrecisionPolicy, expression: str | None = None) -> dict:
  """The whole policy as a JSON-ready dict (deterministic, plain lists/dicts/scalars):
  ``expression`` (default the policy's name), ``name``, ``rules`` (site, layers, spec with
  every QuantSpec field), ``gemm`` (every GemmConfig field, or None), ``gemm_layers``,
  ``gemm_bf16_tail``. Two policies that quantize alike and share the expression give
  equal records. The GEMM's ``impl`` and ``fp8_mma`` appear only when they are not the
  defaults (``"auto"``, False), and a spec's ``four_over_six``, ``four_over_six_max`` and
  ``row_scaled`` only when set (not None, 256, False), so records written before those
  fields existed still match."""
  fields = dataclasses.asdict(policy)
  for name, default in (("impl", "auto"), ("fp8_mma", False), ("rht_gemms", "wgrad"),
                        ("backward_from_forward", False), ("from_forward", ())):
    if fields["gemm"] is not None and fields["gemm"][name] == default:
      del fields["gemm"][name]
  for name in OVERRIDES:  # a backward copy's own spec, only where it has one
    if fields["gemm"] is not None and fields["gemm"]["roles"][name] is None:
      del fields["gemm"]["roles"][name]
  _drop_spec_defaults(fields)
  out = {"expression": policy.name if expression is None else expression.strip(), **fields}
  return json.loads(json.dumps(out, sort_keys=True))


_SPEC_FIELDS_SINCE = (("four_over_six", None), ("four_over_six_max", 256),
                      ("row_scaled", False))


def _drop_spec_defaults(tree) -> None:
  """Removes, in place, the QuantSpec fields of :data:`_SPEC_FIELDS_SINCE` that hold their
  defaults from every spec dict (one with ``format`` and ``granularity``) in ``tree``."""
  if isinstance(tree, dict):
    if "format" in tree and "granularity" in tree:
      for name, default in _SPEC_FIELDS_SINCE:
        if name in tree and tree[name] == default:
          del tree[name]
    for value in tree.values():
      _drop_spec_defaults(value)
  elif isinstance(tree, list | tuple):
    for value in tree:
      _drop_spec_defaults(value)


def site_policy(site: str, layers: str | int, spec: fp8jax.QuantSpec,
                name: str | None = None) -> PrecisionPolicy:
  """A one-rule policy, e.g. ``site_policy("attn_out", "0-8", fp8jax.preset(...))``."""
  parsed = parse_layers(layers)
  return PrecisionPolicy((SiteRule(site, parsed, spec),),
                         name or f"{site}@{layers}:{spec.format}")


def noise_spec(spec: fp8jax.QuantSpec | None, on: bool) -> fp8jax.QuantSpec | None:
  """``spec`` (and its cotangent spec) with ``noise_control`` set to ``on``."""
  return None if spec is None else spec.replace(noise_control=on,
                                                backward=noise_spec(spec.backward, on))


def noise_gemm(gemm, on: bool, name: str):
  """GEMM config ``gemm`` (None: none) with ``noise_control`` set to ``on`` in every
  operand's spec; a scaling-aware transpose is refused, naming policy ``name``."""
  if on and gemm is not None and gemm.transpose == "scaling_aware":
    raise ValueError(f"policy {name!r}: the scaling-aware transpose re-expresses FP8 "
                     "payloads and has no noise-matched control")
  return None if gemm is None else gemm.replace(roles=gemm.roles.map(
      lambda s: noise_spec(s, on)))


def _with_noise(policy: PrecisionPolicy, on: bool, name: str) -> PrecisionPolicy:
  rules = tuple(dataclasses.replace(r, spec=noise_spec(r.spec, on)) for r in policy.rules)
  return dataclasses.replace(policy, rules=rules, gemm=noise_gemm(policy.gemm, on, policy.name),
                             name=name)


def noise_policy(policy: PrecisionPolicy) -> PrecisionPolicy:
  """The noise-matched control of ``policy``, named ``noise(<name>)``: every quantization
  it makes (site rules, their cotangents, the GEMM recipe's roles) keeps its blocks and
  replaces its rounding error by unbiased random noise of the same energy per block
  (:mod:`fp8jax.quant.noise_control`)."""
  if policy.gemm is None and not policy.rules:
    raise ValueError("the BF16 policy quantizes nothing: it has no noise-matched control")
  if is_noise_control(policy):
    raise ValueError(f"policy {policy.name!r} is already a noise-matched control")
  return _with_noise(policy, True, f"noise({policy.name})")


def is_noise_control(policy: PrecisionPolicy) -> bool:
  """Whether ``policy`` is a noise-matched control (:func:`noise_policy`)."""
  specs = [r.spec for r in policy.rules]
  if policy.gemm is not None:
    specs += list(policy.gemm.roles.specs())
  return bool(specs) and all(s.noise_control for s in specs)


def control_base(policy: PrecisionPolicy) -> PrecisionPolicy:
  """The policy whose control ``policy`` is (``noise(NAME)`` -> the policy NAME)."""
  if not is_noise_control(policy):
    raise ValueError(f"policy {policy.name!r} is not a noise-matched control")
  name = policy.name[len("noise("):-1] if _NOISE.match(policy.name) else policy.name
  return _with_noise(policy, False, name)


# --- policy expressions ------------------------------------------------------------

SITE_ALIASES = {"attn": "attn_out", "moe": "moe_out", "mlp": "mlp_out",
                "routed": "moe_routed_out", "shared": "moe_shared_out"}
GRANULARITIES = {"tensor": fp8jax.per_tensor,
                 "channel": lambda: fp8jax.per_axis(-1),
                 "1x128": lambda: fp8jax.tile(128),
                 "128x128": lambda: fp8jax.block((128, 128))}
GEMMS = recipes.RECIPES


DELAYED_SYNTAX = policy_grid.DELAYED_SYNTAX
"""The delayed-scaling suffix of a spec with its defaults (each argument optional)."""


def parse_spec(text: str) -> fp8jax.QuantSpec:
  """A preset name (``deepseek_v3``), or ``FORMAT[/GRANULARITY][/delayed(ARGS)]``: ``e4m3``,
  ``e5m2/1x128`` (granularity ``tensor`` (default), ``channel``, ``1x128``, ``128x128``;
  current scaling, FP32 scales, straight-through backward), ``e4m3/delayed(h=16)``
  (per-tensor delayed scaling, Transformer Engine's recipe: ``h`` the amax history length,
  ``reduce`` ``max`` or ``most_recent``, ``margin`` in powers of two; defaults
  :data:`DELAYED_SYNTAX`)."""
  text = text.strip()
  if text in PRESETS:
    return fp8jax.preset(text)
  parts = text.split("/")
  delayed = parse_delayed(parts.pop(), text) if parts[-1].startswith("delayed") else None
  if not parts or len(parts) > 2 or parts[0] not in FORMATS:
    raise ValueError(f"unknown spec {text!r}: use a preset {sorted(PRESETS)} or "
                     f"FORMAT[/GRANULARITY][/{DELAYED_SYNTAX}] with a format in "
                     f"{sorted(FORMATS)}")
  fmt, gran = parts[0], parts[1] if len(parts) > 1 else "tensor"
  if gran not in GRANULARITIES:
    raise ValueError(f"unknown granularity {gran!r} in {text!r}; known: {sorted(GRANULARITIES)}")
  if delayed is not None and gran != "tensor":
    raise ValueError(f"delayed scaling is per-tensor only, but {text!r} asks for {gran}")
  try:
    return fp8jax.QuantSpec(format=fmt, granularity=GRANULARITIES[gran](), **(delayed or {}))
  except ValueError as e:
    raise ValueError(f"bad spec {text!r}: {e}") from None


_DELAYED = re.compile(r"^delayed(?:\((?P<args>[^()]*)\))?$")
_DELAYED_ARGS = {"h": "history_len", "reduce": "history_reduce", "margin": "margin"}


def parse_delayed(text: str, context: str = "") -> dict:
  """``delayed``, ``delayed()`` or ``delayed(h=16,reduce=most_recent,margin=1)`` (any
  subset, each at most once) -> the :class:`fp8jax.QuantSpec` fields of delayed scaling."""
  where = f" in {context!r}" if context else ""
  m = _DELAYED.match(text.strip())
  if not m:
    raise ValueError(f"malformed {text!r}{where}: use {DELAYED_SYNTAX} (arguments optional)")
  out = {"scaling": "delayed"}
  for arg in filter(None, (a.strip() for a in (m.group("args") or "").split(","))):
    key, eq, value = (s.strip() for s in arg.partition("="))
    if key not in _DELAYED_ARGS:
      raise ValueError(f"unknown delayed(...) argument {key!r}{where}; arguments: "
                       f"{', '.join(_DELAYED_ARGS)} ({DELAYED_SYNTAX})")
    if not eq or not value or _DELAYED_ARGS[key] in out:
      raise ValueError(f"malformed delayed(...) argument {arg!r}{where}: give each of "
                       f"h, reduce, margin at most once as KEY=VALUE ({DELAYED_SYNTAX})")
    if key == "reduce":
      out["history_reduce"] = value
      continue
    try:
      out[_DELAYED_ARGS[key]] = int(value)
    except ValueError:
      raise ValueError(f"delayed(...) argument {key}={value!r}{where} is not an "
                       "integer") from None
  return out


def parse_policy(expr: str) -> PrecisionPolicy:
  """A policy from an expression: ``bf16``, a site-grid cell's name
  ``{attn,moe}_l<LAYERS>_{e4m3,e5m2}[_delayed]`` (e.g. ``moe_l0-8_e4m3``, named by its
  expression looked up in :mod:`fp8jax.models.policy_grid`), or
  terms joined by ``+``: ``SITE@LAYERS:SPEC`` (SITE one of :data:`SITES` or an alias in
  :data:`SITE_ALIASES`; LAYERS as in :func:`parse_layers`; SPEC as in
  :func:`parse_spec`) and ``gemm:RECIPE[@LAYERS]`` (a recipe of ``fp8jax.gemm.recipes``,
  e.g. ``fp32_blockwise`` for DeepSeek-V3's or ``nvfp4_recipe``, on all layers or on
  LAYERS; a recipe with BF16 layers keeps its share of the last layers in BF16).

  Example: ``attn@0-8:e4m3+moe@0:deepseek_v3+gemm:fp32_blockwise``. ``noise(EXPR)`` is
  the noise-matched control of the policy EXPR (:func:`noise_policy`).
  """
  if not isinstance(expr, str):
    raise TypeError(f"a policy expression must be a string, got {type(expr).__name__} "
                    f"{expr!r}")
  expr = expr.strip()
  noise = _NOISE.match(expr)
  if noise:
    return dataclasses.replace(noise_policy(parse_policy(noise.group(1))), name=expr)
  cell = policy_grid.expression_of(expr)
  if cell is not None:
    return dataclasses.replace(parse_policy(cell), name=expr)
  if expr.lower() == "bf16":
    return BF16
  rules, gemm, gemm_layers, tail = [], None, None, 0.0
  for term in filter(None, (t.strip() for t in expr.split("+"))):
    if term.startswith("gemm:"):
      name, at, layers = term[len("gemm:"):].partition("@")
      if name not in GEMMS:
        raise ValueError(f"unknown GEMM recipe {name!r} in {expr!r}; known: {sorted(GEMMS)}")
      if gemm is not None:
        raise ValueError(f"policy {expr!r} names two GEMM recipes; a policy has one")
      gemm, tail = GEMMS[name], recipes.BF16_TAIL.get(name, 0.0)
      gemm_layers = parse_layers(layers) if at else None
      continue
    site, at, rest = term.partition("@")
    layers, colon, spec = rest.partition(":")
    if not (at and colon):
      raise ValueError(f"bad policy term {term!r} in {expr!r}: use SITE@LAYERS:SPEC, "
                       f"gemm:NAME, 'bf16' or a site-grid name {policy_grid.NAME_FORMS}")
    rules.append(SiteRule(SITE_ALIASES.get(site, site), parse_layers(layers), parse_spec(spec)))
  if not rules and gemm is None:
    raise ValueError(f"empty policy expression {expr!r}")
  return PrecisionPolicy(tuple(rules), expr, gemm, gemm_layers, tail)


_NOISE = re.compile(r"^noise\((.+)\)$")
