"""`Rule` and `Rules`: precision rules over module paths, static and hashable.

A rule says what to do to the modules whose path fully matches a regex::

    Rule(r"layers/\\d+/mlp/.*", recipes.recipe("fp32_blockwise"))       # the GEMMs
    Rule(r"layers/\\d+/attn", fp8jax.preset("deepseek_v3"), role="output")
    Rule(r"layers/0/mlp/up", fp8jax.preset("nvfp4_weight"), role="weight")
    Rule(r"head", None, role="gemm")                                    # keep BF16

Fields:

* ``module_path``: a regex that must match the whole path (``re.fullmatch``): NNX graph
  paths joined with ``/`` (``layers/0/mlp/up``), Linen ``module.path`` joined the same
  way; the root module's path is ``""``.
* ``action``: a :class:`fp8jax.GemmConfig` (role ``gemm``), a :class:`fp8jax.QuantSpec`
  (the operand roles and ``output``), or None (roles ``gemm``, ``output`` and the copy
  roles: undo what earlier rules set).
* ``role`` (:data:`ROLES`; default ``gemm`` for a GemmConfig, ``output`` for a spec):

  - ``gemm``: route the module's matmul through :func:`fp8jax.fp8_dot_general` with the
    config, so Fprop, Dgrad and Wgrad are simulated;
  - ``input`` / ``weight`` / ``grad``: replace that operand's spec (X, W or dY) in the
    GEMM config an earlier rule gave the module;
  - ``dgrad_weight`` / ``wgrad_input`` / ``wgrad_grad``: the same for one backward copy
    (W^T for Dgrad, X^T or dY^T for Wgrad; None: the role's spec again), as
    :class:`fp8jax.numerics.roles.RoleSpecs` holds them;
  - ``output``: :func:`fp8jax.fake_quant` of the module's output with the spec (its
    ``backward`` quantizes the cotangent there; None: straight-through).
* ``op`` (:data:`OPS` or None for any): which matmul of the module a GEMM role applies to.

:class:`Rules` is an ordered tuple of rules; **later rules override earlier ones**, as in
:class:`fp8jax.models.policy.PrecisionPolicy`. :func:`resolve` folds the rules matching one
module into a :class:`Plan`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from typing import Any

from fp8jax.gemm.dense import GemmConfig
from fp8jax.numerics.roles import OVERRIDES
from fp8jax.numerics.spec import QuantSpec
from fp8jax.quant.delayed import needs_state

OPS = ("dot_general", "einsum", "ragged_dot")
"""The matmul ops a module may expose for interception."""
OPERAND_ROLES = ("input", "weight", "grad", *OVERRIDES)
ROLES = ("gemm", *OPERAND_ROLES, "output")


@functools.lru_cache(maxsize=512)
def _compile(pattern: str) -> re.Pattern:
  return re.compile(pattern)


@dataclasses.dataclass(frozen=True)
class Rule:
  """One precision rule (see the module docstring). Frozen and hashable."""

  module_path: str
  action: Any
  role: str | None = None
  op: str | None = None

  def __post_init__(self):
    if not isinstance(self.module_path, str):
      raise TypeError(f"{self.label()}: module_path must be a regex string, got "
                      f"{type(self.module_path).__name__}")
    try:
      _compile(self.module_path)
    except re.error as e:
      raise ValueError(f"{self.label()}: bad module_path regex: {e}") from None
    if self.role is None:
      if isinstance(self.action, GemmConfig):
        object.__setattr__(self, "role", "gemm")
      elif isinstance(self.action, QuantSpec):
        object.__setattr__(self, "role", "output")
      else:
        raise TypeError(f"{self.label()}: action must be a GemmConfig or QuantSpec (or None "
                        f"with an explicit role), got {type(self.action).__name__}")
    if self.role not in ROLES:
      raise ValueError(f"{self.label()}: unknown role {self.role!r}; roles: {ROLES}")
    if self.op is not None and self.op not in OPS:
      raise ValueError(f"{self.label()}: unknown op {self.op!r}; ops: {OPS} or None (any)")
    if self.op is not None and self.role == "output":
      raise ValueError(f"{self.label()}: op applies to the GEMM roles, not to 'output'")
    nullable = ("gemm", "output", *OVERRIDES)
    want = (GemmConfig if self.role == "gemm" else QuantSpec,) + (
        (type(None),) if self.role in nullable else ())
    if not isinstance(self.action, want):
      names = " or ".join("None" if t is type(None) else t.__name__ for t in want)
      raise TypeError(f"{self.label()}: role {self.role!r} takes a {names} action, got "
                      f"{type(self.action).__name__}")

  def label(self) -> str:
    """``rule 'PATTERN' (role)``, for messages."""
    role = f", role {self.role}" if self.role else ""
    op = f", op {self.op}" if self.op else ""
    return f"rule {self.module_path!r}{role}{op}"

  def matches(self, path: str) -> bool:
    return _compile(self.module_path).fullmatch(path) is not None

  def describe(self) -> str:
    """The action in words, e.g. ``gemm fp8/fp8/fp8 acc=fp32 ...``."""
    if self.action is None:
      return f"{self.role}: none"
    return f"{self.role}: {self.action.describe()}"


@dataclasses.dataclass(frozen=True)
class Rules:
  """An ordered, hashable tuple of :class:`Rule` (later rules override earlier ones)."""

  rules: tuple[Rule, ...] = ()

  def __init__(self, rules=()):
    rules = tuple(rules)
    for i, r in enumerate(rules):
      if not isinstance(r, Rule):
        raise TypeError(f"rules[{i}] is a {type(r).__name__}, not an fp8jax.rules.Rule")
    object.__setattr__(self, "rules", rules)

  def __iter__(self):
    return iter(self.rules)

  def __len__(self):
    return len(self.rules)

  def __getitem__(self, i):
    return self.rules[i]


def as_rules(rules) -> Rules:
  """``rules`` as :class:`Rules` (a Rules, one Rule, or an iterable of them)."""
  if isinstance(rules, Rules):
    return rules
  if isinstance(rules, Rule):
    return Rules((rules,))
  if isinstance(rules, (str, bytes)) or not hasattr(rules, "__iter__"):
    raise TypeError(f"rules must be fp8jax.rules.Rules or a sequence of Rule, got "
                    f"{type(rules).__name__}")
  return Rules(rules)


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the rules do to one module: a GEMM config per op it exposes, an output spec,
  the indices of the rules that matched it (for reports) and the matmul ops it exposes."""

  gemm: tuple[tuple[str, GemmConfig], ...] = ()
  output: QuantSpec | None = None
  matched: tuple[int, ...] = ()
  ops: tuple[str, ...] = ()

  def config(self, op: str) -> GemmConfig | None:
    return dict(self.gemm).get(op)

  @property
  def empty(self) -> bool:
    return not self.gemm and self.output is None


def resolve(rules: Rules, path: str, ops: tuple[str, ...], aliases: tuple[str, ...] = ()
            ) -> Plan:
  """The :class:`Plan` of the module at ``path`` exposing the matmul ``ops``.

  A GEMM rule counts as matching only where the module exposes its op (a container module
  whose path also fits the regex is skipped); an output rule matches any module. A rule
  whose regex fits one of ``aliases`` (e.g. a GEMM's full parameter path) matches too.

  Raises:
    ValueError: an operand-role rule matches a GEMM that no earlier rule gave a config.
  """
  gemm: dict[str, GemmConfig | None] = {}
  output, matched = None, []
  for i, rule in enumerate(rules):
    if not any(rule.matches(p) for p in (path, *aliases)):
      continue
    if rule.role == "output":
      output = rule.action
      matched.append(i)
      continue
    targets = [op for op in ops if rule.op in (None, op)]
    if not targets:
      continue
    matched.append(i)
    for op in targets:
      if rule.role == "gemm":
        gemm[op] = rule.action
        continue
      base = gemm.get(op)
      if base is None:
        raise ValueError(f"{rule.label()} sets the {rule.role} spec of {op} at {path!r}, but "
                         "no earlier rule gives that GEMM a config (add a role='gemm' rule "
                         "before it)")
      try:
        gemm[op] = base.replace(roles=dataclasses.replace(base.roles,
                                                          **{rule.role: rule.action}))
      except (TypeError, ValueError) as e:
        raise ValueError(f"{rule.label()} at {path!r}: {e}") from None
  configs = tuple((op, c) for op, c in gemm.items() if c is not None)
  return Plan(configs, output, tuple(matched), tuple(ops))


def output_rule(rules: Rules, plan: Plan) -> str:
  """``rule 'PATTERN', role output (rules[i])``: the rule that gives ``plan`` its output
  spec (the last matching output rule), for messages."""
  i = next(i for i in reversed(plan.matched) if rules[i].role == "output")
  return f"{rules[i].label()} (rules[{i}])"


def check_stateless(rules: Rules, path: str, plan: Plan, state_given: bool = False) -> None:
  """ValueError naming the rule when a module's output spec uses delayed scaling and no
  amax histories are given (``state_given``: a
  :func:`~fp8jax.rules.delayed_outputs.delayed_scope` is open, which holds them)."""
  if state_given or plan.output is None or not needs_state(plan.output):
    return
  raise stateless_error(output_rule(rules, plan), path)


def stateless_error(rule: str, path: str) -> ValueError:
  """The error of the output rule labelled ``rule`` (delayed scaling) at the module
  ``path`` run with no amax histories."""
  return ValueError(f"{rule or 'an output rule'} puts delayed scaling on the output of "
                    f"module {path!r}, and no amax histories are given: run the model inside "
                    "fp8jax.rules.delayed_scope(state), the state from "
                    "fp8jax.rules.delayed_init (a model's delayed_init(policy))")


def closest_paths(pattern: str, paths, n: int = 5) -> list[str]:
  """Up to ``n`` of ``paths`` nearest the regex ``pattern``: those it finds with
  ``re.search`` (a match that is not the whole path), then the nearest by
  ``difflib.get_close_matches`` of the regex text (raw, and with ``\\d+``, ``.*`` and
  anchors simplified)."""
  paths = sorted(set(paths))
  rx = _compile(pattern)
  found = [p for p in paths if rx.search(p)]
  plain = re.sub(r"\\d[+*]?|\[[^\]]*\][+*]?", "0", pattern)
  plain = re.sub(r"\.[*+]|[\\^$()?]", "", plain)
  for text in (pattern, plain):
    found += difflib.get_close_matches(text, paths, n=n, cutoff=0.4)
  return list(dict.fromkeys(found))[:n]


def no_match_error(rule: Rule, i: int, need: str, reachable, present=(), lacking: str = ""
                   ) -> ValueError:
  """The one-line error of ``rules[i]``, which acts on none of ``reachable`` (the paths fit
  for it, ``need`` saying which): names a path of ``present`` (the other paths) that it
  does match and what that path is ``lacking``, else the closest paths."""
  text = f"{rule.label()} (rules[{i}]) matches no {need}"
  hits = sorted(p for p in set(present) if rule.matches(p))
  if hits:
    shown = ", ".join(repr(p) for p in hits[:3]) + (f" (+{len(hits) - 3} more)"
                                                    if len(hits) > 3 else "")
    return ValueError(f"{text}: it matches {shown}, which {lacking}")
  close = closest_paths(rule.module_path, reachable)
  every = sorted(set(reachable))
  if close:
    near = f"; closest: {', '.join(map(repr, close))}"
  elif every:
    more = f" (+{len(every) - 3} more)" if len(every) > 3 else ""
    near = f"; none is close among {', '.join(map(repr, every[:3]))}{more}"
  else:
    near = "; there is none"
  return ValueError(f"{text}{near} (module_path must match a whole '/'-joined path: "
                    "re.fullmatch)")


def check_all_matched(rules: Rules, plans: dict[str, Plan], where: str) -> None:
  """ValueError naming the first rule that matched no module of ``where``, with the
  closest paths it could act on, or the path it matches and why it cannot act there."""
  used = {i for p in plans.values() for i in p.matched}
  for i, rule in enumerate(rules):
    if i in used:
      continue
    if rule.role == "output":
      raise no_match_error(rule, i, f"module of {where} that is called", list(plans),
                           list(plans), "has no __call__ output to quantize")
    op = rule.op or "matmul"
    hooked = [p for p, plan in plans.items() if (rule.op in plan.ops if rule.op else plan.ops)]
    raise no_match_error(rule, i, f"module of {where} that has a {op} hook", hooked,
                         list(plans), f"has no {op} hook (dot_general, einsum_op or ragged_dot "
                         "attribute): fp8jax.rules.quantize_gemms reaches the GEMMs of a "
                         "model's own code")
