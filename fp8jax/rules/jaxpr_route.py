"""The jaxpr route's engine: which values of a jaxpr derive from which parameter, and the
jaxpr evaluated again with the GEMMs on parameters replaced.

A :class:`Walker` runs over a jaxpr equation by equation. Every value carries the path of
the parameter leaf it derives from through shape-only equations (:data:`SHAPE_OPS`), or
None. A ``dot_general`` or ``ragged_dot_general`` with an operand that derives from a
parameter is a :class:`Site`; ``decide(site)`` says what to do with it (an
:class:`Action`). Sub-jaxprs are entered: ``jit`` / ``closed_call`` inline; ``remat``
through ``jax.checkpoint``; ``scan``, ``cond``, ``while`` through ``lax.scan``,
``lax.switch``, ``lax.while_loop``; ``custom_jvp_call`` / ``custom_vjp_call`` inline
(their primal body, differentiated by JAX) only where they hold a quantized GEMM, else
bound unchanged with their own derivative rule. Any other primitive is bound unchanged,
and a GEMM on a parameter inside it is reported as not entered.

With ``compute=False`` the walker only follows the paths and records the sites (the
abstract report); with ``compute=True`` it evaluates, binding every other equation as
it is, so the result is the jaxpr's own wherever no GEMM is replaced. The jaxpr is
interpreted, so no cache of JAX (a jitted ``jnp.matmul``'s trace) can skip a replacement
or carry one into another function.
"""

from __future__ import annotations

from collections.abc import Callable
import contextlib
import dataclasses
import re
from typing import Any

import jax
from jax import lax
from jax.extend import core as jex_core

from fp8jax.gemm.dense import GemmConfig
from fp8jax.rules import ops as ops_lib

SHAPE_OPS = frozenset({
    "transpose", "reshape", "convert_element_type", "broadcast_in_dim", "squeeze",
    "expand_dims", "slice", "dynamic_slice", "copy", "copy_p", "reduce_precision", "rev",
    "sharding_constraint", "mesh_cast", "reshard", "pvary"})
"""Equations whose first operand's parameter path passes to their outputs."""
_ONE_TO_ONE = frozenset({"optimization_barrier"})
"""Equations whose i-th output is their i-th operand."""
_INLINE = frozenset({"jit", "pjit", "closed_call", "core_call"})
_CUSTOM = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})
_REMAT = frozenset({"remat2", "checkpoint", "remat"})
_EINSUM = re.compile(r"[\w. ]*,[\w. ]*(->[\w. ]*)?")
_MARK = re.compile(re.escape(ops_lib.MARK) + r"(\d+)")
_RAGGED_DIMS = ((((1,), (1,)), ((), ())), (0,), (0,))


@dataclasses.dataclass(frozen=True)
class Site:
  """One GEMM equation: ``op`` (``dot_general``, ``einsum``: a ``dot_general`` made by
  ``jnp.einsum``, or ``ragged_dot``), the operands' shapes, the parameter path each
  derives from (None: an activation), the primitives it sits in (``context``) and whether
  the walker enters them (``entered``)."""

  op: str
  lhs: tuple[int, ...]
  rhs: tuple[int, ...]
  lhs_param: str | None
  rhs_param: str | None
  context: tuple[str, ...] = ()
  entered: bool = True
  supported: bool = True

  @property
  def weight(self) -> str | None:
    """The parameter the rules decide on: the rhs's, else the lhs's."""
    return self.rhs_param or self.lhs_param


@dataclasses.dataclass(frozen=True)
class Action:
  """What to do with a site: ``config`` (None: leave it), the rules that decided, and a
  note saying why it stays unquantized."""

  config: GemmConfig | None = None
  rules: tuple[int, ...] = ()
  note: str = ""


def _open(jaxpr) -> tuple[Any, list]:
  """``(jaxpr, consts)`` of a closed or open jaxpr (ClosedJaxpr of older JAX, or the merged
  Jaxpr class with its ``consts``)."""
  return getattr(jaxpr, "jaxpr", jaxpr), list(getattr(jaxpr, "consts", ()))


def _subjaxprs(params) -> list:
  out = []
  for value in params.values():
    for v in (value if isinstance(value, tuple) else (value,)):
      if isinstance(v, (jex_core.Jaxpr, jex_core.ClosedJaxpr)):
        out.append(v)
  return out


def _names(eqn) -> str:
  return str(getattr(eqn.source_info, "name_stack", ""))


def _scan_counts(params, n: int) -> tuple[int, int]:
  """(number of consts, of carries) of a scan equation with ``n`` operands."""
  if "ft_in" in params:
    consts, carry, _ = params["ft_in"].update(list(range(n))).unpack()
    return len(list(consts)), len(list(carry))
  return params["num_consts"], params["num_carry"]


def _bind(eqn, ins):
  params = eqn.primitive.get_bind_params(eqn.params)
  subfuns, params = params if isinstance(params, tuple) else ((), params)
  manager = getattr(getattr(eqn, "ctx", None), "manager", None) or contextlib.nullcontext()
  with manager:
    out = eqn.primitive.bind(*subfuns, *ins, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


class Walker:
  """Follows parameter paths through jaxprs (see the module docstring).

  Args:
    decide: Site -> Action.
    compute: evaluate (True) or only follow paths and record (False).
  Attributes:
    sites: ``[(Site, Action)]`` met (``compute=False``).
    hooks: ``{i: parameter paths}`` feeding the equations made by recorded hook call ``i``
      (those under the name scope ``fp8jax_hook_<i>``: :func:`fp8jax.rules.ops.recording`).
    order: ``("site", index into sites)`` and ``("hook", i)`` in the order met.
  """

  def __init__(self, decide: Callable[[Site], Action], compute: bool):
    self.decide = decide
    self.compute = compute
    self.sites: list[tuple[Site, Action]] = []
    self.hooks: dict[int, set[str]] = {}
    self.order: list[tuple[str, int]] = []

  def run(self, jaxpr, args, paths, context=(), entered=True):
    """Runs ``jaxpr`` on ``args`` (None each when not computing) whose parameter paths
    are ``paths``; returns (outputs, their paths)."""
    jaxpr, consts = _open(jaxpr)
    env, where = {}, {}
    for v, x, p in zip(jaxpr.constvars, consts, [None] * len(consts)):
      env[v], where[v] = x, p
    for v, x, p in zip(jaxpr.invars, args, paths, strict=True):
      env[v], where[v] = x, p

    def read(v):
      return v.val if isinstance(v, jex_core.Literal) else env.get(v)

    def path(v):
      return None if isinstance(v, jex_core.Literal) else where.get(v)

    for eqn in jaxpr.eqns:
      outs, out_paths = self._eqn(eqn, [read(v) for v in eqn.invars],
                                  [path(v) for v in eqn.invars], context, entered)
      for v, x, p in zip(eqn.outvars, outs, out_paths, strict=True):
        env[v], where[v] = x, p
    return [read(v) for v in jaxpr.outvars], [path(v) for v in jaxpr.outvars]

  def _eqn(self, eqn, ins, paths, context, entered):
    name, n_out = eqn.primitive.name, len(eqn.outvars)
    none = [None] * n_out
    mark = _MARK.search(_names(eqn))
    if mark:  # made by a hook call: report which parameters reach it
      i = int(mark.group(1))
      if i not in self.hooks:
        self.order.append(("hook", i))
      self.hooks.setdefault(i, set()).update(p for p in paths if p)
      return self._bound(eqn, ins), none
    if name in SHAPE_OPS:
      return self._bound(eqn, ins), [paths[0]] * n_out
    if name in _ONE_TO_ONE:
      return self._bound(eqn, ins), list(paths)
    if name in ("dot_general", "ragged_dot_general"):
      return self._gemm(eqn, ins, paths, context, entered), none
    subs = _subjaxprs(eqn.params)
    if not subs or (self.compute and not any(paths)):
      return self._bound(eqn, ins), none
    if not entered:
      self._skip(eqn, subs, paths, context)
      return none, none
    if name in _INLINE:
      return self.run(subs[0], ins, paths, context, entered)
    if name in _CUSTOM:
      if not self._quantizes(subs[0], paths):
        if not self.compute:
          self.run(subs[0], ins, paths, (*context, name), entered)
        return self._bound(eqn, ins), none
      return self.run(subs[0], ins, paths, (*context, name), entered)[0], none
    if name in _REMAT:
      return self._remat(eqn, subs[0], ins, paths, context), none
    if name == "scan":
      return self._scan(eqn, subs[0], ins, paths, context), none
    if name == "cond":
      return self._cond(eqn, ins, paths, context), none
    if name == "while":
      return self._while(eqn, ins, paths, context), none
    self._skip(eqn, subs, paths, context)
    return self._bound(eqn, ins), none

  def _bound(self, eqn, ins):
    return _bind(eqn, ins) if self.compute else [None] * len(eqn.outvars)

  def _skip(self, eqn, subs, paths, context):
    """Records the sites inside a primitive the walker does not enter (not computing)."""
    if self.compute:
      return
    for sub in subs:
      n = len(_open(sub)[0].invars)
      inner = list(paths) if n == len(paths) else [None] * n
      self.run(sub, [None] * n, inner, (*context, eqn.primitive.name), entered=False)

  def _quantizes(self, sub, paths) -> bool:
    """Whether a GEMM inside ``sub`` is replaced."""
    probe = Walker(self.decide, compute=False)
    probe.run(sub, [None] * len(paths), paths)
    return any(action.config is not None for _, action in probe.sites)

  def _site(self, eqn, paths, context, entered) -> Site:
    lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
    op, supported = "dot_general", True
    if eqn.primitive.name == "ragged_dot_general":
      op = "ragged_dot"
      dims = eqn.params["ragged_dot_dimension_numbers"]
      got = (tuple(tuple(map(tuple, d)) for d in dims.dot_dimension_numbers),
             tuple(dims.lhs_ragged_dimensions), tuple(dims.rhs_group_dimensions))
      supported = (got == _RAGGED_DIMS and eqn.params.get("group_offset") is None
                   and lhs.ndim == 2 and rhs.ndim == 3 and paths[1] is not None)
    elif any(_EINSUM.fullmatch(part) for part in _names(eqn).split("/")):
      op = "einsum"
    return Site(op, tuple(lhs.shape), tuple(rhs.shape), paths[0], paths[1], tuple(context),
                entered, supported)

  def _gemm(self, eqn, ins, paths, context, entered):
    site = self._site(eqn, paths, context, entered)
    action = self.decide(site)
    if not self.compute:
      self.order.append(("site", len(self.sites)))
      self.sites.append((site, action))
      return [None]
    if action.config is None:
      return _bind(eqn, ins)
    module = site.weight.rpartition("/")[0]
    dtype = eqn.outvars[0].aval.dtype
    if site.op == "ragged_dot":
      return [ops_lib.QuantRaggedDot(action.config, module)(*ins[:3]).astype(dtype)]
    fn = ops_lib.QuantDotGeneral(action.config, module)
    dims, precision = eqn.params["dimension_numbers"], eqn.params.get("precision")
    if site.rhs_param is None:
      return [ops_lib.weight_left(fn, ins[0], ins[1], dims, precision, dtype)]
    return [fn(ins[0], ins[1], dims, precision, dtype)]

  def _remat(self, eqn, sub, ins, paths, context):
    ctx = (*context, "remat")
    if not self.compute:
      return self.run(sub, ins, paths, ctx)[0]
    fn = jax.checkpoint(lambda *a: self.run(sub, a, paths, ctx)[0],
                        prevent_cse=eqn.params.get("prevent_cse", True),
                        policy=eqn.params.get("policy"))
    return list(fn(*ins))

  def _scan(self, eqn, sub, ins, paths, context):
    nc, nk = _scan_counts(eqn.params, len(ins))
    inner = [*paths[:nc], *[None] * nk, *paths[nc + nk:]]
    ctx = (*context, "scan")
    if not self.compute:
      return self.run(sub, ins, inner, ctx)[0]
    consts = ins[:nc]

    def body(carry, xs):
      outs = self.run(sub, [*consts, *carry, *xs], inner, ctx)[0]
      return outs[:nk], outs[nk:]

    carry, ys = lax.scan(body, ins[nc:nc + nk], ins[nc + nk:], length=eqn.params["length"],
                         reverse=eqn.params["reverse"], unroll=eqn.params["unroll"])
    return [*carry, *ys]

  def _cond(self, eqn, ins, paths, context):
    branches, ctx = eqn.params["branches"], (*context, "cond")
    if not self.compute:
      for b in branches:
        out = self.run(b, ins[1:], paths[1:], ctx)[0]
      return out
    fns = [lambda *a, b=b: self.run(b, a, paths[1:], ctx)[0] for b in branches]
    return list(lax.switch(ins[0], fns, *ins[1:]))

  def _while(self, eqn, ins, paths, context):
    cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    cc, bc, init = ins[:cn], ins[cn:cn + bn], ins[cn + bn:]
    cp, bp = paths[:cn], paths[cn:cn + bn]
    carry_paths, ctx = [None] * len(init), (*context, "while")
    cond_j, body_j = eqn.params["cond_jaxpr"], eqn.params["body_jaxpr"]
    if not self.compute:
      self.run(cond_j, [*cc, *init], [*cp, *carry_paths], ctx)
      return self.run(body_j, [*bc, *init], [*bp, *carry_paths], ctx)[0]
    return list(lax.while_loop(
        lambda c: self.run(cond_j, [*cc, *c], [*cp, *carry_paths], ctx)[0][0],
        lambda c: self.run(body_j, [*bc, *c], [*bp, *carry_paths], ctx)[0], list(init)))
