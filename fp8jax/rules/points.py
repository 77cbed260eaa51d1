"""Named points: the engine's answers for paths that are not NNX or Linen modules.

A model that quantizes values inside one module's ``__call__`` (a residual branch, the
sum of two expert groups, a GEMM it computes with its own code) names each such value by
a path, as if it were a module, and asks the rules what to do there::

    spec = output_spec(rules, "layers/3/moe_out")                  # QuantSpec or None
    config = gemm_config(rules, "layers/3/self_attn/q_proj")       # GemmConfig or None
    config = gemm_config(rules, "layers/3/mlp", op="ragged_dot")

The answers come from the same :func:`fp8jax.rules.rule.resolve` as for modules, so one
:class:`~fp8jax.rules.Rules` drives both. They are cached per ``(rules, path, op)``: a
model asking at trace time costs one regex pass per path. A named point may use delayed
scaling: the model that names it carries the amax history (e.g.
``fp8jax.models.delayed_sites``), as :mod:`fp8jax.rules.delayed_outputs` does for module
outputs.
"""

from __future__ import annotations

import functools

from fp8jax.gemm.dense import GemmConfig
from fp8jax.numerics.spec import QuantSpec
from fp8jax.rules import rule as rule_lib


@functools.lru_cache(maxsize=16384)
def plan_at(rules: rule_lib.Rules, path: str, ops: tuple[str, ...] = ()) -> rule_lib.Plan:
  """The :class:`~fp8jax.rules.rule.Plan` of the point ``path`` exposing ``ops``."""
  return rule_lib.resolve(rule_lib.as_rules(rules), path, ops)


def output_spec(rules: rule_lib.Rules, path: str) -> QuantSpec | None:
  """The fake-quant spec of the value named ``path`` (None: left in high precision)."""
  return plan_at(rules, path).output


def gemm_config(rules: rule_lib.Rules, path: str, op: str = "dot_general"
                ) -> GemmConfig | None:
  """The GEMM config of the matmul ``op`` at ``path`` (None: high precision)."""
  if op not in rule_lib.OPS:
    raise ValueError(f"gemm_config at {path!r}: unknown op {op!r}; ops: {rule_lib.OPS}")
  return plan_at(rules, path, (op,)).config(op)
