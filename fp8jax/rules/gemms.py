"""The jaxpr route: every GEMM on a parameter, whatever code computes it.

    qloss = fp8jax.rules.quantize_gemms(loss, rules)       # loss(params, batch) -> scalar
    value, grads = jax.value_and_grad(qloss)(params, batch)
    print(fp8jax.rules.describe(loss, rules, params, batch))

:func:`quantize_gemms` traces ``fn`` to a jaxpr over its array arguments
(``jax.make_jaxpr``), follows which values derive from which leaf of the parameter
arguments (``argnums``) through shape-only equations (:mod:`fp8jax.rules.jaxpr_route`),
and evaluates the jaxpr again with each ``dot_general`` (and ``lax.ragged_dot``) one of
whose operands is a parameter replaced by the GEMM recipe of the rule that matches it:
``x @ self.w``, ``jnp.matmul``, ``jnp.dot``, ``jnp.einsum`` on a parameter, a tied head
``h @ embedding.T`` and the hooks of Flax layers alike. The recipes are those of
:mod:`fp8jax.rules.ops` (:func:`fp8jax.fp8_dot_general`), so ``jax.grad`` of the result
runs their Dgrad and Wgrad.

A rule matches a GEMM when its ``module_path`` fully matches the parameter's module path
(its path minus the leaf name: ``blocks/0/attn/qkv`` for ``blocks/0/attn/qkv/kernel``)
or the parameter's full path. The parameter is the rhs operand's (the weight role), else
the lhs's, whose GEMM then runs with the operands swapped so the weight keeps the weight
role. A ``dot_general`` made by ``jnp.einsum`` is op ``einsum``; ``lax.ragged_dot`` is op
``ragged_dot``; any other, ``dot_general``. Roles ``gemm``, ``input``, ``weight`` and
``grad`` apply; ``output`` rules need module boundaries, which a jaxpr does not have.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from fp8jax.rules import jaxpr_route
from fp8jax.rules import rule as rule_lib
from fp8jax.rules.jaxpr_route import Action, Site


def _key(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def path_of(keypath) -> str:
  """A pytree key path as ``a/b/0/kernel`` (an NNX Variable's trailing ``value`` key
  dropped)."""
  keys = list(keypath)
  if keys and isinstance(keys[-1], jax.tree_util.GetAttrKey) and keys[-1].name == "value":
    keys = keys[:-1]
  return "/".join(_key(k) for k in keys)


def _is_array(x) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def _aval(x):
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  return jax.ShapeDtypeStruct(np.shape(x), x.dtype,
                              weak_type=getattr(jax.typeof(x), "weak_type", False))


def split_arrays(tree):
  """(the array leaves of ``tree``, arrays or ``jax.ShapeDtypeStruct``, in order;
  ``rebuild(arrays) -> tree`` with those leaves replaced and the others as given): a call's
  inputs traced over their arrays, flags closed over."""
  leaves, treedef = jax.tree.flatten(tree)
  dyn = [i for i, x in enumerate(leaves) if _is_array(x)]

  def rebuild(arrays):
    vals = list(leaves)
    for i, x in zip(dyn, arrays):
      vals[i] = x
    return jax.tree.unflatten(treedef, vals)

  return [leaves[i] for i in dyn], rebuild


def trace(fn, args: tuple, kwargs: dict, argnums: tuple[int, ...]):
  """``fn(*args, **kwargs)`` traced over its array leaves (the others are closed over:
  :func:`split_arrays`).

  Returns:
    (jaxpr, the array leaves in order, each leaf's parameter path (None outside the
    positional arguments ``argnums``; an argument that is one array: its index), the
    output's treedef).
  """
  tree = (tuple(args), dict(kwargs))
  arrays, rebuild = split_arrays(tree)

  def flat(*xs):
    a, k = rebuild(xs)
    return fn(*a, **k)

  jaxpr, out = jax.make_jaxpr(flat, return_shape=True)(*[_aval(x) for x in arrays])
  paths = []
  for keys, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if _is_array(x):
      own = keys[0].idx == 0 and keys[1].idx in argnums
      paths.append((path_of(keys[2:]) or str(keys[1].idx)) if own else None)
  return jaxpr, arrays, paths, jax.tree.structure(out)


def decide(rules: rule_lib.Rules, site: Site) -> Action:
  """The :class:`Action` of the rules on one GEMM site."""
  if site.weight is None:
    return Action(note="no parameter operand")
  module = site.weight.rpartition("/")[0]
  plan = rule_lib.resolve(rules, module, (site.op,), aliases=(site.weight,))
  config = plan.config(site.op)
  if config is None:
    return Action(None, plan.matched, "a rule keeps it" if plan.matched else "no rule")
  if not site.entered:
    return Action(None, plan.matched, f"inside {site.context[-1]}, which this route does "
                  "not enter")
  if not site.supported:
    return Action(None, plan.matched, "a ragged_dot_general other than lax.ragged_dot's "
                  "x [N, K] . w [E, K, F]")
  return Action(config, plan.matched)


def _reasons(sites, paths, op: str | None) -> tuple[list[str], dict[str, str]]:
  """(the module and parameter paths a rule of ``op`` can act on, {other path: why not})."""
  fit, why = [], {}
  for site, _ in sites:
    if site.weight is None:
      continue
    names = (site.weight.rpartition("/")[0], site.weight)
    if not site.entered or not site.supported:
      reason = (f"is used by a GEMM inside {site.context[-1]}, which this route does not "
                "enter") if not site.entered else "is used by an unsupported ragged_dot"
    elif op not in (None, site.op):
      reason = f"is used by {site.op} GEMMs only, not {op}"
    else:
      fit += names
      continue
    why.update({n: reason for n in names})
  for p in paths:
    if p is not None:
      for n in (p.rpartition("/")[0], p):
        why.setdefault(n, "feeds no GEMM (no dot_general takes it through shape-only "
                          "operations)")
  return fit, {p: r for p, r in why.items() if p not in fit}


def check_used(rules: rule_lib.Rules, sites, paths, where: str) -> None:
  """ValueError naming the first rule that quantizes no GEMM of ``where`` (its closest
  paths, or the path it matches and why nothing happens there)."""
  used = {i for s, a in sites if s.entered and s.supported for i in a.rules}
  for i, rule in enumerate(rules):
    if i in used:
      continue
    fit, why = _reasons(sites, paths, rule.op)
    hit = next((p for p in sorted(why) if rule.matches(p)), None)
    raise rule_lib.no_match_error(
        rule, i, f"{rule.op or 'GEMM'} on a parameter of {where}", fit,
        [hit] if hit is not None else [], why.get(hit, ""))


def check_rules(rules) -> rule_lib.Rules:
  """``rules`` as Rules; TypeError/ValueError naming a rule of role ``output``."""
  rules = rule_lib.as_rules(rules)
  for i, r in enumerate(rules):
    if r.role == "output":
      raise ValueError(f"{r.label()} (rules[{i}]): quantize_gemms quantizes GEMMs; a "
                       "module's output needs module boundaries (quantize_model, intercept, "
                       "or a named point)")
  return rules


class QuantizedGemms:
  """``fn`` with its GEMMs on parameters quantized by rules: :func:`quantize_gemms`."""

  def __init__(self, fn, rules, argnums=0, strict: bool = True):
    functools.update_wrapper(self, fn, updated=())
    self.fn = fn
    self.rules = check_rules(rules)
    self.argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    self.strict = strict
    self.name = getattr(fn, "__name__", type(fn).__name__)

  def sites(self, *args, **kwargs) -> tuple[list[tuple[Site, Action]], list]:
    """(every GEMM ``fn(*args, **kwargs)`` runs with what the rules do to it, the
    parameter path of each array leaf), from an abstract trace (arrays or
    ``jax.ShapeDtypeStruct``; nothing is computed)."""
    jaxpr, values, paths, _ = trace(self.fn, args, kwargs, self.argnums)
    return self._walk(jaxpr, values, paths, check=False), paths

  def _walk(self, jaxpr, values, paths, check: bool):
    walker = jaxpr_route.Walker(functools.partial(decide, self.rules), compute=False)
    walker.run(jaxpr, [None] * len(values), paths)
    if check and len(self.rules) and not any(p is not None for p in paths):
      raise ValueError(f"quantize_gemms: {self.name!r} has no array in its parameter "
                       f"argument(s) {self.argnums}: pass the parameters as an argument "
                       "(arrays closed over are constants of the trace)")
    if check:
      check_used(self.rules, walker.sites, paths, f"{self.name!r}")
    return walker.sites

  def __call__(self, *args, **kwargs):
    jaxpr, values, paths, out_tree = trace(self.fn, args, kwargs, self.argnums)
    if self.strict:
      self._walk(jaxpr, values, paths, check=True)
    walker = jaxpr_route.Walker(functools.partial(decide, self.rules), compute=True)
    return jax.tree.unflatten(out_tree, walker.run(jaxpr, values, paths)[0])


def quantize_gemms(fn, rules, *, argnums=0, strict: bool = True) -> QuantizedGemms:
  """``fn`` with every GEMM on a parameter run through the recipe its rule gives.

  Args:
    fn: any function of arrays, e.g. ``lambda params, x: nnx.merge(graphdef, params,
      rest)(x)`` or ``lambda params, x: linen_model.apply({"params": params}, x)``.
    rules: :class:`fp8jax.rules.Rules` (roles gemm, input, weight, grad).
    argnums: the positional argument(s) holding the parameters; their pytree paths,
      "/"-joined, are what the rules match (module path: the path minus the leaf name).
    strict: raise when a rule quantizes no GEMM (checked at every trace).

  Returns:
    A callable with ``fn``'s signature (jit it: each call traces ``fn``). Non-array
    leaves of the arguments are static. ``fp8jax.rules.describe(fn, rules, *args)``
    reports each GEMM.

  Raises:
    ValueError: a rule of role output; at the call, a rule that quantizes nothing
      (naming the closest paths), or a spec that does not fit its operand.
  """
  return QuantizedGemms(fn, rules, argnums, strict)
