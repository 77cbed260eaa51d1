"""Rules on a Flax Linen model, through ``nn.intercept_methods``.

    with fp8jax.rules.intercept(rules):
      logits = model.apply(variables, tokens)

Every method call of a bound module passes the interceptor, which knows the module's
``path`` (joined with ``/``) and resolves the rules for it once per path:

* GEMM rules: while the matched module's method runs, its ``dot_general`` attribute (the
  hook ``nn.Dense`` and ``nn.DenseGeneral`` read at call time; ``dot_general_cls`` is
  cleared for that time) is the simulated GEMM of :mod:`fp8jax.rules.ops`, then restored.
  Linen's ``nn.Einsum`` has no such hook: einsum rules apply to user modules exposing
  ``einsum_op`` (and ragged-dot rules to ``ragged_dot``).
* output rules: the result of the module's ``__call__`` is fake-quantized; a delayed-scaled
  one reads its amax histories from the open
  :func:`~fp8jax.rules.delayed_outputs.delayed_scope`.

Nothing is changed outside the ``with`` block and no parameter moves. The interception
happens at trace time, so a jitted function must call ``model.apply`` inside the block
(and takes the rules as a static argument to be retraced when they change). At the end
of the block every rule must have matched a module called in it (``strict``), as
:func:`fp8jax.rules.quantize_model` checks for NNX.
"""

from __future__ import annotations

import contextlib

from flax import linen as nn
import jax

from fp8jax.rules import delayed_outputs, gemms
from fp8jax.rules import ops as ops_lib
from fp8jax.rules import rule as rule_lib

_HOOKS = {"dot_general": "dot_general", "einsum": "einsum_op", "ragged_dot": "ragged_dot"}


def module_path(module: nn.Module) -> str:
  return "/".join(str(k) for k in module.path)


def module_ops(module: nn.Module) -> tuple[str, ...]:
  return tuple(op for op, attr in _HOOKS.items() if hasattr(module, attr))


class _Interceptor:
  """Applies the rules to each intercepted call; records ``{path: Plan}`` as it goes."""

  def __init__(self, rules: rule_lib.Rules):
    self.rules = rules
    self.plans: dict[str, rule_lib.Plan] = {}

  def plan(self, module: nn.Module) -> rule_lib.Plan:
    path = module_path(module)
    if path not in self.plans:
      self.plans[path] = rule_lib.resolve(self.rules, path, module_ops(module))
    return self.plans[path]

  def __call__(self, next_fun, args, kwargs, context):
    module = context.module
    plan = self.plan(module)
    if plan.empty or context.method_name == "setup":
      return next_fun(*args, **kwargs)
    saved = {}
    for op, config in plan.gemm:
      for attr, value in ((_HOOKS[op], ops_lib.OP_CALLABLES[op](config, module_path(module))),
                          *((("dot_general_cls", None),) if op == "dot_general" else ())):
        if hasattr(module, attr):
          saved.setdefault(attr, getattr(module, attr))
          object.__setattr__(module, attr, value)
    try:
      out = next_fun(*args, **kwargs)
    finally:
      for attr, value in saved.items():
        object.__setattr__(module, attr, value)
    if plan.output is not None and context.method_name == "__call__":
      path = module_path(module)
      rule_lib.check_stateless(self.rules, path, plan, delayed_outputs.active())
      out = ops_lib.quantize_output(out, plan.output, path,
                                    rule_lib.output_rule(self.rules, plan))
    return out


@contextlib.contextmanager
def intercept(rules, *, strict: bool = True):
  """Applies ``rules`` to every Linen module called inside the block; yields the
  interceptor, whose ``plans`` maps each path seen to its :class:`~fp8jax.rules.rule.Plan`.

  ``strict``: when the block ends without an exception, a ValueError names the first rule
  that matched no module called in it (with the closest paths), or says that no module
  ran at all (a function jitted outside the block replays its cached trace without the
  interception); ``False`` skips the check (a block that runs part of a model)."""
  rules = rule_lib.as_rules(rules)
  interceptor = _Interceptor(rules)
  with nn.intercept_methods(interceptor):
    yield interceptor
  if strict and len(rules):
    if not interceptor.plans:
      raise ValueError(f"intercept: no Linen module ran inside the block, so its {len(rules)} "
                       "rules applied to nothing (a function jitted outside the block replays "
                       "its cached trace: call model.apply inside it, within the block)")
    rule_lib.check_all_matched(rules, interceptor.plans, "the intercept block")


def linen_plans(model: nn.Module, rules, *args, method=None, **kwargs) -> dict:
  """``{path: Plan}`` of every module ``model.init(key, *args, **kwargs)`` calls (traced
  abstractly with ``jax.eval_shape``: nothing is computed). Array leaves of the inputs
  may be arrays or ``jax.ShapeDtypeStruct``; other leaves (flags) are passed as given."""
  rules = rule_lib.as_rules(rules)
  arrays, rebuild = gemms.split_arrays((args, kwargs))
  found = {}

  def trace(arrays):
    a, kw = rebuild(arrays)
    with delayed_outputs.discovering(), intercept(rules, strict=False) as icpt:
      model.init(jax.random.key(0), *a, method=method, **kw)
    found.update(icpt.plans)
    return 0

  jax.eval_shape(trace, arrays)
  return found


def check_linen(model: nn.Module, rules, *args, **kwargs) -> dict:
  """:func:`linen_plans`, raising ValueError naming the first rule that matches no module."""
  rules = rule_lib.as_rules(rules)
  found = linen_plans(model, rules, *args, **kwargs)
  rule_lib.check_all_matched(rules, found, f"the {type(model).__name__} model")
  return found
