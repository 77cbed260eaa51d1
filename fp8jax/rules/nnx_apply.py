"""Rules on a Flax NNX model: :func:`quantize_nnx` returns a quantized graph copy.

How (checked on flax 0.12.12), and why it is robust:

* **GEMMs** go through the hooks NNX's own layers take as constructor arguments: the
  ``dot_general`` attribute (``nnx.Linear``, ``nnx.LinearGeneral``, whose
  ``dot_general_cls`` is cleared so it does not take precedence), ``einsum_op``
  (``nnx.Einsum``) and, for user modules that expose one, ``ragged_dot``. These are public
  arguments read at call time, so setting them on a copy changes no parameter, no path and
  no line of the model. The callables (:mod:`fp8jax.rules.ops`) are frozen dataclasses:
  static, hashable attributes of the graph definition.
* **Outputs**: NNX has no method interception, and a Python call looks ``__call__`` up on
  the type, so the matched module's class is swapped for a cached subclass whose
  ``__call__`` fake-quantizes the result of the original one, with the spec in a static
  attribute. Wrapping the module in another module instead would change its parameter
  paths; the subclass keeps the state tree identical. A delayed-scaled output reads its
  amax histories from the :func:`~fp8jax.rules.delayed_outputs.delayed_scope` open when
  it runs (they are not module state: the graph definition stays static).

The copy (``nnx.split`` + ``nnx.merge``) shares the parameter arrays and has the same state
structure as the original: ``nnx.split`` of both gives one parameter tree and two graph
definitions, the second usable with ``nnx.merge`` inside a plain ``jax.jit``. Equal rules
give equal graph definitions, so a jitted function does not trace again.
"""

from __future__ import annotations

import dataclasses
import functools

from flax import nnx

from fp8jax.rules import ops as ops_lib
from fp8jax.rules import rule as rule_lib

_HOOKS = {"dot_general": "dot_general", "einsum": "einsum_op", "ragged_dot": "ragged_dot"}
"""Op kind -> the attribute of a module that computes it."""
_SPEC_ATTR = "_fp8jax_output_spec"
_PATH_ATTR = "_fp8jax_path"
_RULE_ATTR = "_fp8jax_output_rule"


def module_paths(model: nnx.Module) -> dict[str, nnx.Module]:
  """``{"layers/0/mlp": module, ...}``: every module of the graph by its path (the root is
  ``""``; a module shared by two attributes appears once, under its first path)."""
  out = {}
  for path, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Module) and not any(str(k).startswith("_pytree") for k in path):
      out["/".join(str(k) for k in path)] = node
  return out


def module_ops(module: nnx.Module) -> tuple[str, ...]:
  """The matmul ops whose hook attribute ``module`` has (see :data:`_HOOKS`)."""
  return tuple(op for op, attr in _HOOKS.items() if hasattr(module, attr))


def plans(model: nnx.Module, rules) -> dict[str, rule_lib.Plan]:
  """``{path: Plan}`` for every module of ``model`` (empty plans included)."""
  rules = rule_lib.as_rules(rules)
  out = {}
  for path, module in module_paths(model).items():
    ops = module_ops(module)
    plan = rule_lib.resolve(rules, path, ops)
    if plan.output is not None and not callable(module):
      plan = dataclasses.replace(plan, output=None, matched=tuple(
          i for i in plan.matched if rules[i].role != "output"))
    out[path] = plan
  return out


@functools.cache
def _output_class(base: type) -> type:
  """A subclass of ``base`` whose ``__call__`` fake-quantizes the output (cached, so equal
  rules give equal graph definitions)."""

  def __call__(self, *args, **kwargs):
    out = base.__call__(self, *args, **kwargs)
    spec = getattr(self, _SPEC_ATTR, None)
    if spec is None:
      return out
    return ops_lib.quantize_output(out, spec, getattr(self, _PATH_ATTR, "?"),
                                   getattr(self, _RULE_ATTR, ""))

  return type(base.__name__, (base,), {"__call__": __call__, "__module__": base.__module__,
                                       "__qualname__": base.__qualname__,
                                       "_fp8jax_base": base})


def _apply(module: nnx.Module, path: str, plan: rule_lib.Plan, rules: rule_lib.Rules
           ) -> None:
  for op, config in plan.gemm:
    setattr(module, _HOOKS[op], ops_lib.OP_CALLABLES[op](config, path))
    if op == "dot_general" and getattr(module, "dot_general_cls", None) is not None:
      module.dot_general_cls = None
  if plan.output is not None:
    base = getattr(type(module), "_fp8jax_base", type(module))
    module.__class__ = _output_class(base)
    setattr(module, _SPEC_ATTR, plan.output)
    setattr(module, _PATH_ATTR, path)
    setattr(module, _RULE_ATTR, rule_lib.output_rule(rules, plan))


def quantize_nnx(model: nnx.Module, rules, *, strict: bool = True) -> nnx.Module:
  """A copy of ``model`` with ``rules`` applied (``model`` itself is left unchanged).

  Args:
    model: any ``nnx.Module``.
    rules: :class:`fp8jax.rules.Rules` or a sequence of :class:`fp8jax.rules.Rule`.
    strict: raise when a rule matches no module (a typo in a regex changes nothing
      silently otherwise).

  An output rule with delayed scaling needs the module's amax histories when it runs
  (:mod:`fp8jax.rules.delayed_outputs`).

  Raises:
    ValueError: a rule matches nothing (``strict``) or an operand rule has no GEMM config
      to refine; the message names the rule.
  """
  if not isinstance(model, nnx.Module):
    raise TypeError(f"quantize_nnx: model must be an nnx.Module, got {type(model).__name__}")
  rules = rule_lib.as_rules(rules)
  graphdef, state = nnx.split(model)
  copy = nnx.merge(graphdef, state)
  found = plans(copy, rules)
  if strict:
    rule_lib.check_all_matched(rules, found, f"the {type(model).__name__} model")
  modules = module_paths(copy)
  for path, plan in found.items():
    if not plan.empty:
      _apply(modules[path], path, plan, rules)
  return copy
