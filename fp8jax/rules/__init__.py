"""Precision rules over module paths, for any Flax model (NNX or Linen).

A :class:`Rule` pairs a regex over module paths with an action: a GEMM recipe
(:class:`fp8jax.GemmConfig`, e.g. ``fp8jax.recipes.recipe("fp32_blockwise")``), an operand
spec inside that GEMM, or a fake-quant of the module's output. :class:`Rules` orders them;
later rules override earlier ones. :func:`quantize_model` applies them to an NNX model,
:func:`intercept` to a Linen model while it runs, and :func:`describe` reports which module
gets what. The model's code is not edited. A model that names values inside its modules
asks :func:`output_spec` / :func:`gemm_config` for those named points. See ``docs/rules.md``.
"""

from fp8jax.rules.api import describe, plans, quantize_model
from fp8jax.rules.linen_apply import check_linen, intercept
from fp8jax.rules.nnx_apply import module_paths
from fp8jax.rules.points import gemm_config, output_spec
from fp8jax.rules.rule import OPS, ROLES, Plan, Rule, Rules

__all__ = ["OPS", "ROLES", "Plan", "Rule", "Rules", "check_linen", "describe",
           "gemm_config", "intercept", "module_paths", "output_spec", "plans",
           "quantize_model"]
