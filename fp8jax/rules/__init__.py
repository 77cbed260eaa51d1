"""Precision rules over module paths, for any Flax model (NNX or Linen).

A :class:`Rule` pairs a regex over module paths with an action: a GEMM recipe
(:class:`fp8jax.GemmConfig`, e.g. ``fp8jax.recipe("fp32_blockwise")``), an operand
spec inside that GEMM, or a fake-quant of the module's output. :class:`Rules` orders them;
later rules override earlier ones. A recipe that keeps its last layers in BF16 (the NVFP4
recipe) becomes rules through :class:`Recipe` (``Recipe.named(name).rules(num_layers,
layer_path)``), which adds them. Two routes apply them, neither editing the model's code:

* the hook route: :func:`quantize_model` sets the matmul hooks of an NNX model's layers
  (``nnx.Linear``, ``nnx.Einsum``, ...), :func:`intercept` those of a Linen model while it
  runs; output rules fake-quantize module outputs;
* the jaxpr route: :func:`quantize_gemms` replaces every GEMM on a parameter in a traced
  function (``x @ self.w``, ``jnp.einsum``, a tied head as well as the layers).

:func:`describe` reports, from an abstract trace on example inputs, each GEMM that runs and
what the rules do to it. A model that names values inside its modules asks
:func:`output_spec` / :func:`gemm_config` for those named points. Output rules with delayed
scaling read their amax histories, explicit state from :func:`delayed_init`, inside
:func:`delayed_scope` (:mod:`fp8jax.rules.delayed_outputs`). See ``docs/rules.md``.
"""

from fp8jax.rules.api import describe, plans, quantize_model
from fp8jax.rules.delayed_outputs import delayed_init, delayed_scope
from fp8jax.rules.gemms import quantize_gemms
from fp8jax.rules.linen_apply import check_linen, intercept
from fp8jax.rules.nnx_apply import module_paths
from fp8jax.rules.points import gemm_config, output_spec
from fp8jax.rules.recipe_rules import Recipe
from fp8jax.rules.rule import OPS, ROLES, Plan, Rule, Rules

__all__ = ["OPS", "ROLES", "Plan", "Recipe", "Rule", "Rules", "check_linen", "delayed_init",
           "delayed_scope", "describe", "gemm_config", "intercept", "module_paths",
           "output_spec", "plans", "quantize_gemms", "quantize_model"]
