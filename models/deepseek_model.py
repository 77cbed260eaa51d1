"""DeepSeek-MoE (:mod:`fp8jax.models.deepseek_moe`) as a :class:`fp8jax.models.api.Model`.

    model = deepseek_model.model(config.deepseek_moe_2b(), Options(scan=ScanOptions()))

Its own options (the MoE kernel, MoE dispatch groups, the deterministic mode, the layer
scan) are bound here, in :class:`Options`, so that training and the study call
``model.apply(params, tokens, policy, delayed=..., param_transform=...)`` alike for every
model. Its policies are :class:`fp8jax.models.policy.PrecisionPolicy` (``--policy`` text
as :func:`fp8jax.models.policy.parse_policy` reads it).
"""

from __future__ import annotations

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


def model(cfg: config_lib.ModelConfig, options: Options = Options(),
          name: str = NAME) -> api.Model:
  """DeepSeek-MoE of config ``cfg`` computing as ``options`` say: its LM + balance loss,
  routing and expert grouping (:data:`fp8jax.models.param_paths.DEEPSEEK`)."""
  scan = options.scan

  def apply(params, tokens, policy, *, delayed=None, telemetry=False, param_transform=None,
            train=True, **overrides):
    """``overrides``: fields of the bound options' :class:`~fp8jax.models.deepseek_compute.
    Compute` (``moe_impl``, ``moe_groups``, ``deterministic``; None: the bound value)."""
    compute = deepseek_moe.Compute.of(
        options.compute, gemm_telemetry=telemetry and policy.gemm is not None,
        **{k: v for k, v in overrides.items() if v is not None})
    return deepseek_moe.apply(params, tokens, cfg, policy, train=train, compute=compute,
                              delayed_state=delayed, scan_layers=scan,
                              param_transform=param_transform)

  def layer_runs(policy):
    return deepseek_moe.layer_runs(cfg, policy)

  def store(params):
    return layer_stack.stack(params, layer_runs(policy_lib.BF16)) if scan else params

  def check(policy):
    if not isinstance(policy, policy_lib.PrecisionPolicy):
      raise TypeError(f"DeepSeek-MoE takes a PrecisionPolicy, got {type(policy).__name__}")
    policy.check_layers(cfg.num_hidden_layers, cfg.is_moe_layer)

  return api.Model(
      name=name, abstract_params=lambda: deepseek_moe.abstract_params(cfg), apply=apply,
      loss=deepseek_moe.lm_loss, baseline=policy_lib.BF16, classifier=param_paths.DEEPSEEK,
      init=lambda rng: deepseek_moe.init(cfg, rng), vocab_size=cfg.vocab_size,
      max_len=cfg.max_position_embeddings,
      flops_per_token=lambda seq_len: flops_per_token(cfg, seq_len),
      parse_policy=policy_lib.parse_policy, record=policy_lib.record,
      direct=lambda p: param_paths.direct_modules(p, cfg.num_hidden_layers), check=check,
      delayed_init=lambda p: delayed_sites.init(cfg, p),
      describe=lambda p: policy_meta(p, cfg.num_hidden_layers),
      meta=dataclasses.asdict(cfg), layer_runs=layer_runs, store=store,
      param_transform=False, config=cfg)

