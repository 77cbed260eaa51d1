"""DeepSeek-MoE (:mod:`fp8jax.models.deepseek_moe`) as a :class:`fp8jax.models.api.Model`.

    model = deepseek_model.model(config.deepseek_moe_2b(), Options(scan=ScanOptions()))

Its own options (the MoE kernel, MoE dispatch groups, the deterministic mode, the layer
scan) are bound here, in :class:`Options`, so that training and the study call
``model.apply(params, tokens, policy, delayed=..., param_transform=...)`` alike for every
model. Its policies are :class:`fp8jax.models.api.Variant` s as every model's: the
``--policy`` text is read by :func:`fp8jax.models.policy.parse_policy` into a
:class:`~fp8jax.models.policy.PrecisionPolicy` (the parse tree, the Variant's ``source``)
and compiled to rules (:func:`variant`); a PrecisionPolicy passed in is converted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses

from fp8jax.gemm import recipes
from fp8jax.models import (
  api,
  deepseek_moe,
  delayed_sites,
  layer_scan,
  layer_stack,
  param_paths,
  policy_expression,
  policy_grid,
  policy_rules,
)
from fp8jax.models import config as config_lib
from fp8jax.models import policy as policy_lib
from fp8jax.models import policy_record as record_lib

NAME = "deepseek_moe"


@dataclasses.dataclass(frozen=True)
class Options:
  """How DeepSeek-MoE computes (not what): the same function either way.

  Attributes:
    moe_impl: the routed experts' kernel (:data:`fp8jax.models.deepseek_moe.MOE_IMPLS`).
    moe_groups: dispatch the MoE per group of B / moe_groups sequences (one per device of
      a program that XLA partitions).
    deterministic: the same bits on every GPU run (:mod:`fp8jax.train.determinism`).
    scan: alike consecutive layers as one ``lax.scan``, their params stored stacked
      (:class:`fp8jax.models.layer_scan.ScanOptions`, or True for its defaults); None or
      False: the layer loop.
  """
  moe_impl: str = "dispatch"
  moe_groups: int = 1
  deterministic: bool = False
  scan: layer_scan.ScanOptions | bool | None = None

  def __post_init__(self):
    self.compute  # noqa: B018  # its checks: the MoE path and groups

  @property
  def compute(self) -> deepseek_moe.Compute:
    """How each forward pass computes (:class:`~fp8jax.models.deepseek_compute.Compute`)."""
    return deepseek_moe.Compute(moe_impl=self.moe_impl, moe_groups=int(self.moe_groups),
                                deterministic=self.deterministic)


def matmul_params(cfg: config_lib.ModelConfig) -> int:
  """Weights multiplied per token (activated params minus embedding and norms)."""
  norms = cfg.hidden_size * (2 * cfg.num_hidden_layers + 1)
  return config_lib.param_counts(cfg)["activated"] - cfg.vocab_size * cfg.hidden_size - norms


def flops_per_token(cfg: config_lib.ModelConfig, seq_len: int) -> float:
  """Training model FLOPs per token at ``seq_len`` (PaLM's: 3 x forward):
  ``6 * N_matmul + 12 * L * d * S``; ``N_matmul`` counts the weights every token
  multiplies (attention, router, shared experts, ``num_experts_per_tok`` routed experts
  at their unpadded width, dense MLPs, head), ``12 L d S`` the attention core (causal
  masking not discounted)."""
  attention = 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len
  return 6.0 * matmul_params(cfg) + attention


def site_cell(policy: policy_lib.PrecisionPolicy) -> dict | None:
  """The site grid's cell that ``policy`` computes, whatever its name: ``{"module": "attn"
  or "moe", "depth": "l0" or "l0-8", "format": "e4m3" or "e5m2"}`` when its numerics are
  those of ``{module}@{layers}:{format}`` (:mod:`fp8jax.models.policy_grid`) on
  consecutive layers; else None."""
  if len(policy.rules) != 1 or policy.gemm is not None or policy.rules[0].layers is None:
    return None
  rule = policy.rules[0]
  lo, hi = min(rule.layers), max(rule.layers)
  modules = [m for m, site in policy_grid.MODULES.items() if site == rule.site]
  if not modules or tuple(rule.layers) != tuple(range(lo, hi + 1)):
    return None
  depth = f"{lo}" if lo == hi else f"{lo}-{hi}"
  for fmt in policy_grid.FORMATS:
    cell = policy_lib.parse_policy(policy_grid.cell_expression(modules[0], depth, fmt))
    if policy_expression.same_numerics(policy, cell):
      return {"module": modules[0], "depth": f"l{depth}", "format": fmt}
  return None


def policy_record(policy: policy_lib.PrecisionPolicy, num_layers: int | None) -> dict:
  """The policy's record (:mod:`fp8jax.models.policy_record`) on a model of ``num_layers``
  layers (None: a depth not known, so ``bf16_layers`` None): its site rules, its GEMM
  recipe (named by config and BF16 share; a control's by the config it controls), whether
  it is a noise-matched control, and its site-grid cell (:func:`site_cell`; None for a
  control)."""
  try:
    expr = policy_expression.to_expression(policy)
  except ValueError:
    expr = None
  noise = policy_lib.is_noise_control(policy)
  sites = [record_lib.site_entry(r.site, r.layers, r.spec) for r in policy.rules]
  gemm = None
  if policy.gemm is not None:
    base = policy_lib.control_base(policy).gemm if noise else policy.gemm
    bf16 = None if num_layers is None else recipes.last_layers(
        policy.bf16_tail_layers(num_layers), num_layers)
    gemm = record_lib.gemm_entry(policy.gemm, record_lib.recipe_name(
        base, policy.gemm_bf16_tail), policy.gemm_layers, bf16)
  return record_lib.build(policy.name, expr, sites, gemm, noise,
                          None if noise else site_cell(policy))


def policy_meta(policy: policy_lib.PrecisionPolicy, num_layers: int) -> dict:
  """A policy's ``meta.json`` entry: its canonical expression, directly quantized modules,
  kind (``"policy"``, or ``"control"`` with ``control_of``, the name of the policy it
  controls) and its ``record`` (:func:`policy_record`: the site-grid cell and GEMM recipe
  the report reads instead of the name)."""
  entry = {"expr": policy_expression.to_expression(policy),
           "direct": sorted(param_paths.direct_modules(policy, num_layers)), "kind": "policy"}
  if policy_lib.is_noise_control(policy):
    entry.update(kind="control", control_of=policy_lib.control_base(policy).name)
  entry["record"] = policy_record(policy, num_layers)
  return entry


def variant(policy: policy_lib.PrecisionPolicy, num_layers: int) -> api.Variant:
  """The :class:`~fp8jax.models.api.Variant` of ``policy`` on a model of ``num_layers``
  layers: its rules (:func:`fp8jax.models.policy_rules.policy_rules`), canonical
  expression, record (:func:`policy_record`), ``control_of`` and ``source`` (``policy``)."""
  try:
    expr = policy_expression.to_expression(policy)
  except ValueError:
    expr = ""
  control_of = (policy_lib.control_base(policy).name if policy_lib.is_noise_control(policy)
                else None)
  return api.Variant(policy.name, policy_rules.policy_rules(policy, num_layers), expr,
                     policy_record(policy, num_layers), control_of, source=policy)


def expand(spec: str, num_layers: int, grids: Mapping[str, Callable[[int], dict[str, str]]]
           ) -> list[api.Variant]:
  """The Variants of one ``--policies`` entry on a model of ``num_layers`` layers: a grid
  of ``grids`` (``{name: f(num_layers) -> {policy name: expression}}``) its cells,
  ``noise(GRID)`` their noise-matched controls (:func:`fp8jax.models.policy.noise_policy`),
  anything else one policy's text (:func:`fp8jax.models.policy.parse_policy`)."""
  inner = spec[len("noise("):-1] if spec.startswith("noise(") and spec.endswith(")") else ""
  grid = grids.get(inner or spec)
  if grid is None:
    return [variant(policy_lib.parse_policy(spec), num_layers)]
  out = []
  for name, expr in grid(num_layers).items():
    pol = dataclasses.replace(policy_lib.parse_policy(expr), name=name)
    out.append(variant(policy_lib.noise_policy(pol) if inner else pol, num_layers))
  return out


def is_deepseek(model: api.Model) -> bool:
  """Whether ``model`` is DeepSeek-MoE (its config a
  :class:`~fp8jax.models.config.ModelConfig`)."""
  return isinstance(model.config, config_lib.ModelConfig)


def source(policy) -> policy_lib.PrecisionPolicy | None:
  """The PrecisionPolicy of a Variant (named as the Variant, which may have been renamed)
  or ``policy`` itself; None for a Variant built from rules."""
  if isinstance(policy, policy_lib.PrecisionPolicy):
    return policy
  src = getattr(policy, "source", None)
  if not isinstance(src, policy_lib.PrecisionPolicy):
    return None
  return src if src.name == policy.name else dataclasses.replace(src, name=policy.name)


def model(cfg: config_lib.ModelConfig, options: Options = Options(),
          name: str = NAME) -> api.Model:
  """DeepSeek-MoE of config ``cfg`` computing as ``options`` say: its LM + balance loss,
  routing and expert grouping (:data:`fp8jax.models.param_paths.DEEPSEEK`)."""
  scan = options.scan
  n = cfg.num_hidden_layers

  def as_variant(policy) -> api.Variant:
    if isinstance(policy, policy_lib.PrecisionPolicy):
      return variant(policy, n)
    if not isinstance(policy, api.Variant):
      raise TypeError(f"DeepSeek-MoE takes an api.Variant, got {type(policy).__name__}")
    return policy

  def apply(params, tokens, policy, *, delayed=None, telemetry=False, param_transform=None,
            train=True, **overrides):
    """``overrides``: fields of the bound options' :class:`~fp8jax.models.deepseek_compute.
    Compute` (``moe_impl``, ``moe_groups``, ``deterministic``; None: the bound value)."""
    policy = as_variant(policy)
    gemm = any(r.role != "output" and r.action is not None for r in policy.rules)
    compute = deepseek_moe.Compute.of(
        options.compute, gemm_telemetry=telemetry and gemm,
        **{k: v for k, v in overrides.items() if v is not None})
    return deepseek_moe.apply(params, tokens, cfg, policy, train=train, compute=compute,
                              delayed_state=delayed, scan_layers=scan,
                              param_transform=param_transform)

  def layer_runs(policy):
    return deepseek_moe.layer_runs(cfg, as_variant(policy))

  def store(params):
    return layer_stack.stack(params, layer_runs(policy_lib.BF16)) if scan else params

  def check(policy):
    src = source(as_variant(policy))
    if src is not None:
      src.check_layers(n, cfg.is_moe_layer)

  def record(policy, text=None):
    src = source(as_variant(policy))
    return api.rules_record(policy, text) if src is None else policy_lib.record(src, text)

  def direct(policy):
    src = source(as_variant(policy))
    return frozenset() if src is None else param_paths.direct_modules(src, n)

  def describe(policy):
    policy = as_variant(policy)
    src = source(policy)
    return api.variant_meta(policy) if src is None else policy_meta(src, n)

  return api.Model(
      name=name, abstract_params=lambda: deepseek_moe.abstract_params(cfg), apply=apply,
      loss=deepseek_moe.lm_loss, baseline=variant(policy_lib.BF16, n),
      classifier=param_paths.DEEPSEEK, init=lambda rng: deepseek_moe.init(cfg, rng),
      vocab_size=cfg.vocab_size, max_len=cfg.max_position_embeddings,
      flops_per_token=lambda seq_len: flops_per_token(cfg, seq_len),
      parse_policy=lambda text: variant(policy_lib.parse_policy(text), n), record=record,
      direct=direct, check=check,
      delayed_init=lambda p: delayed_sites.init(cfg, as_variant(p)),
      describe=describe, meta=dataclasses.asdict(cfg), layer_runs=layer_runs, store=store,
      param_transform=False, config=cfg)
