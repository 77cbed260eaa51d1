"""fp8jax's GEMM recipes as a qwix provider: select them with qwix rules.

    from fp8jax.rules import qwix_provider
    provider = qwix_provider.provider([
        qwix_provider.rule(r"blocks/\\d+/fc1", recipes.recipe("fp32_blockwise")),
        qwix_provider.rule(r".*", recipes.recipe("fp8_tensor"), op_names=("einsum",)),
    ])
    qmodel = qwix.quantize_model(model, provider, x)         # NNX (example input)
    qmodel = qwix.quantize_model(linen_model, provider)      # Linen

While a matched module runs (with JIT disabled, so that no cached trace of ``jnp.matmul``
skips the interception or carries it into another model), qwix intercepts
``jax.lax.dot_general``, ``jax.numpy.einsum`` and ``jax.lax.ragged_dot``; the provider
routes them through the same callables as
:mod:`fp8jax.rules` (:mod:`fp8jax.rules.ops`: :func:`fp8jax.fp8_dot_general`,
:func:`fp8jax.gemm.grouped.fp8_ragged_dot`), so one recipe gives the same bits by either
route. qwix's precedence holds here: the **first** matching rule wins (fp8jax's
:class:`~fp8jax.rules.Rules`: the last); :func:`from_rules` translates one into the
other. fp8jax's lhs operand is the input role: when a ``dot_general``'s lhs is a
parameter of the module and its rhs is not, the provider swaps them (and transposes the
result back), so the weight gets the weight spec.

qwix (``pip install 'qwix>=0.1.8'``) is imported inside the functions: fp8jax does not
depend on it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fp8jax.gemm.dense import GemmConfig
from fp8jax.rules import ops as ops_lib
from fp8jax.rules import rule as rule_lib


def _qwix():
  try:
    import qwix  # noqa: PLC0415 - optional dependency, imported on use
  except ImportError as e:
    raise ImportError("fp8jax.rules.qwix_provider needs qwix: pip install "
                      "'qwix>=0.1.8'") from e
  return qwix


@functools.cache
def rule_class() -> type:
  """``Fp8jaxRule``: a ``qwix.QuantizationRule`` with a ``gemm`` field (a
  :class:`fp8jax.GemmConfig`, or None to leave the matched ops in high precision)."""
  qwix = _qwix()

  @dataclasses.dataclass(frozen=True, kw_only=True)
  class Fp8jaxRule(qwix.QuantizationRule):
    gemm: GemmConfig | None = None

  return Fp8jaxRule


def rule(module_path: str = ".*", gemm: GemmConfig | None = None, *,
         op_names=()):
  """A qwix rule selecting the fp8jax recipe ``gemm`` for the ops ``op_names`` (any of
  ``dot_general``, ``einsum``, ``ragged_dot``; empty: all) of the modules whose path
  fully matches ``module_path``."""
  label = f"qwix rule {module_path!r}"
  if gemm is not None and not isinstance(gemm, GemmConfig):
    raise TypeError(f"{label}: gemm must be an fp8jax GemmConfig or None, got "
                    f"{type(gemm).__name__}")
  op_names = tuple(op_names)
  bad = [op for op in op_names if op not in rule_lib.OPS]
  if bad:
    raise ValueError(f"{label}: unknown op {bad[0]!r}; ops: {rule_lib.OPS}")
  rule_lib.Rule(module_path, gemm, role="gemm")  # the regex checks of fp8jax's rules
  return rule_class()(module_path=module_path, op_names=op_names, gemm=gemm)


def from_rules(rules) -> list:
  """fp8jax :class:`~fp8jax.rules.Rules` of the ``gemm`` role as qwix rules, in reverse
  order (qwix's first match wins where fp8jax's last does)."""
  rules = rule_lib.as_rules(rules)
  out = []
  for i, r in enumerate(rules):
    if r.role != "gemm":
      raise ValueError(f"{r.label()} (rules[{i}]): only role 'gemm' rules have a qwix "
                       f"form (a recipe per op); role {r.role!r} does not")
    out.append(rule(r.module_path, r.action, op_names=(r.op,) if r.op else ()))
  return out[::-1]


@functools.cache
def provider_class() -> type:
  """``Fp8jaxProvider``: a ``qwix.QuantizationProvider`` whose rules are
  :func:`rule_class` rules."""
  qwix = _qwix()
  from qwix._src.utils import flax_util  # noqa: PLC0415 - qwix's operand detection

  class Fp8jaxProvider(qwix.QuantizationProvider):
    """Routes the intercepted matmuls of matched modules through fp8jax's recipes."""

    def _init_rule(self, r):
      if not isinstance(r, rule_class()):
        raise TypeError(f"Fp8jaxProvider takes fp8jax_rule(...) rules "
                        f"(fp8jax.rules.qwix_provider.rule), got {type(r).__name__}")
      return super()._init_rule(r)

    def _path(self) -> str:
      return "/".join(map(str, flax_util.get_current_module_path()))

    def _config(self, op: str) -> GemmConfig | None:
      r = self._get_current_rule_and_op_id(op, only_rule=True)[0]
      return None if r is None else r.gemm

    def dot_general(self, lhs, rhs, dimension_numbers, precision=None,
                    preferred_element_type=None, *, out_sharding=None):
      config = self._config("dot_general")
      if config is None:
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type,
                                   out_sharding=out_sharding)
      fn = ops_lib.QuantDotGeneral(config, self._path())
      if flax_util.find_param(lhs) is not None and flax_util.find_param(rhs) is None:
        return ops_lib.weight_left(fn, lhs, rhs, dimension_numbers, precision,
                                   preferred_element_type)
      return fn(lhs, rhs, dimension_numbers, precision, preferred_element_type)

    def einsum(self, subscripts, *operands, precision=None, preferred_element_type=None,
               _dot_general=jax.lax.dot_general, out_sharding=None):  # noqa: N803
      config = self._config("einsum")
      if config is None:
        return jnp.einsum(subscripts, *operands, precision=precision,
                          preferred_element_type=preferred_element_type,
                          _dot_general=_dot_general, out_sharding=out_sharding)
      if len(operands) != 2:
        raise ValueError(f"Fp8jaxProvider: einsum {subscripts!r} has {len(operands)} "
                         "operands; the fp8jax recipes take two")
      return ops_lib.QuantEinsum(config, self._path())(subscripts, *operands, precision=precision,
                                         preferred_element_type=preferred_element_type)

    def ragged_dot(self, lhs, rhs, group_sizes, precision=None, preferred_element_type=None,
                   group_offset=None):
      config = self._config("ragged_dot")
      if config is None:
        return jax.lax.ragged_dot(lhs, rhs, group_sizes, precision=precision,
                                  preferred_element_type=preferred_element_type,
                                  group_offset=group_offset)
      if group_offset is not None:
        raise ValueError("Fp8jaxProvider: ragged_dot with group_offset is not supported")
      return ops_lib.QuantRaggedDot(config, self._path())(lhs, rhs, group_sizes)

    def get_intercept_map(self):
      return super().get_intercept_map() | {
          "jax.lax.dot_general": self.dot_general, "jax.numpy.einsum": self.einsum,
          "jax.lax.ragged_dot": self.ragged_dot}

  return Fp8jaxProvider


def provider(rules, *, disable_jit: bool = True):
  """An ``Fp8jaxProvider`` for ``qwix.quantize_model``: ``rules`` a sequence of
  :func:`rule` (qwix order: the first match wins), or fp8jax
  :class:`~fp8jax.rules.Rules` / :class:`~fp8jax.rules.Rule` s (translated by
  :func:`from_rules`).

  ``disable_jit`` (qwix's option, on here): a matched module's methods run under
  ``jax.disable_jit()``, so ``@``, ``jnp.matmul`` and ``jnp.dot`` (jitted functions whose
  traces JAX caches) reach the intercepted ``lax.dot_general`` every time. Off, the result
  depends on which model traced them first in the process: one traced earlier without
  interception leaves them unquantized, and one traced under it leaks the quantized
  product into later unquantized models."""
  if isinstance(rules, rule_lib.Rule):
    rules = (rules,)
  rules = list(rules)
  if isinstance(rules, rule_lib.Rules) or any(isinstance(r, rule_lib.Rule) for r in rules):
    rules = from_rules(rules)
  return provider_class()(rules, disable_jit=disable_jit)
