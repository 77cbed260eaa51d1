"""``describe``'s reports of what runs, from an abstract trace on example inputs (nothing
is computed): one line per GEMM with its parameter path, op, operand shapes and action,
then the outputs quantized, the modules whose parameter GEMMs stay unquantized and the
rules that act on nothing.

    blocks/0/fc1/kernel  dot_general [2,8,32]x[32,64]  recipe fp32_blockwise  (rules 0, 1)
    attn/qkv/kernel  dot_general [2,8,32]x[32,96]  not quantized: the model's own code ...
    -  dot_general [2,2,8,16]x[2,2,8,16] (x2)  not quantized: no parameter operand
"""

from __future__ import annotations

from flax import linen as nn
from flax import nnx
import jax

from fp8jax.gemm import recipes
from fp8jax.rules import delayed_outputs, gemms, jaxpr_route, linen_apply, nnx_apply
from fp8jax.rules import ops as ops_lib
from fp8jax.rules import rule as rule_lib
from fp8jax.rules.jaxpr_route import Action, Site


def config_name(config) -> str:
  """``recipe NAME`` for a named recipe, else the config in words."""
  name = next((n for n, c in recipes.RECIPES.items() if c == config), None)
  return f"recipe {name}" if name else config.describe()


def _shape(shape) -> str:
  return "[" + ",".join(map(str, shape)) + "]"


def _rules(indices) -> str:
  return f"  (rules {', '.join(map(str, indices))})" if indices else ""


def _module(path: str) -> str:
  """The module path of a parameter path (its path minus the leaf name)."""
  return path.rpartition("/")[0]


def site_line(site: Site, action: Action) -> str:
  where = site.weight or "-"
  ctx = f" in {'/'.join(site.context)}" if site.context else ""
  what = (config_name(action.config) if action.config is not None
          else f"not quantized: {action.note}")
  return (f"{where}  {site.op} {_shape(site.lhs)}x{_shape(site.rhs)}{ctx}  {what}"
          f"{_rules(action.rules)}")


def _collapse(lines: list[str]) -> list[str]:
  """Repeated lines once, with ``(xN)`` after the shapes."""
  counts: dict[str, int] = {}
  for ln in lines:
    counts[ln] = counts.get(ln, 0) + 1
  out = []
  for ln, n in counts.items():
    if n > 1:
      head, sep, tail = ln.partition("  ")
      first, sep2, rest = tail.partition("  ")
      ln = f"{head}{sep}{first} (x{n}){sep2}{rest}"
    out.append(ln)
  return out


def _summary(sites, used, rules, route: str, name: str) -> tuple[list[str], list[str]]:
  """(header lines, footer lines) of a report."""
  on_params = [(s, a) for s, a in sites if s.weight is not None]
  done = sum(a.config is not None for _, a in on_params)
  head = [f"GEMMs of {name} ({route}; abstract trace): {len(on_params)} on parameters, "
          f"{done} quantized, {len(sites) - len(on_params)} on activations only"]
  left = sorted({_module(s.weight) or "<root>" for s, a in on_params if a.config is None})
  foot = [f"not quantized: the GEMMs on the parameters of {', '.join(left)}"] if left else []
  foot += [f"unmatched: rules[{i}] {r.label()}" for i, r in enumerate(rules) if i not in used]
  return head, foot


def jaxpr_report(quantized: gemms.QuantizedGemms, *args, **kwargs) -> str:
  """The report of the jaxpr route (:func:`fp8jax.rules.quantize_gemms`)."""
  sites, _ = quantized.sites(*args, **kwargs)
  used = {i for s, a in sites if s.entered and s.supported for i in a.rules}
  head, foot = _summary(sites, used, quantized.rules, "jaxpr route", repr(quantized.name))
  return "\n".join(head + _collapse([site_line(s, a) for s, a in sites]) + foot)


def _trace_nnx(model, rules, args, kwargs):
  quantized = nnx_apply.quantize_nnx(model, rules, strict=False)
  found = nnx_apply.plans(quantized, rules)
  graphdef, params, rest = nnx.split(quantized, nnx.Param, ...)

  def fn(p, r, *a, **k):
    with delayed_outputs.discovering():  # delayed-scaled outputs: empty histories
      return nnx.merge(graphdef, p, r)(*a, **k)

  return fn, (params, rest), found


def _trace_linen(model, rules, args, kwargs):
  variables = jax.eval_shape(lambda *a: model.init(jax.random.key(0), *a, **kwargs), *args)
  rest = {k: v for k, v in variables.items() if k != "params"}
  found: dict[str, rule_lib.Plan] = {}

  def fn(p, r, *a, **k):
    with delayed_outputs.discovering(), linen_apply.intercept(rules, strict=False) as icpt:
      out = model.apply({"params": p, **r}, *a, **k)
    found.update(icpt.plans)
    return out

  return fn, (variables.get("params", {}), rest), found


def _why_not(site: Site, found: dict) -> str:
  """Why a GEMM outside the hooks stays unquantized."""
  if site.weight is None:
    return "no parameter operand"
  plan = found.get(_module(site.weight))
  if plan is not None and plan.gemm:
    return ("the model's own code, not the "
            f"{'/'.join(op for op, _ in plan.gemm)} hook its rules set")
  return "no rule" if plan is not None and plan.ops else "the model's own code (no hook)"


def hook_report(model, rules, *args, **kwargs) -> str:
  """The report of the hook route (:func:`fp8jax.rules.quantize_model` for NNX,
  :func:`fp8jax.rules.intercept` for Linen) on the example inputs: the hooks that ran,
  and every GEMM on a parameter that ran outside them (the model's own code)."""
  rules = rule_lib.as_rules(rules)
  build = _trace_linen if isinstance(model, nn.Module) else _trace_nnx
  fn, params, found = build(model, rules, args, kwargs)
  with ops_lib.recording() as calls:
    jaxpr, values, paths, _ = gemms.trace(fn, (*params, *args), kwargs, (0,))
  walker = jaxpr_route.Walker(lambda s: Action(), compute=False)
  walker.run(jaxpr, [None] * len(values), paths)
  gemm_rules = {p: tuple(i for i in plan.matched if rules[i].role != "output")
                for p, plan in found.items()}
  sites, outputs, ran = [], [], set()
  for call in calls:
    if call.kind == "output":
      by = [i for i in found[call.path].matched if rules[i].role == "output"]
      outputs.append(f"{call.path or '<root>'}  output {_shape(call.shapes[0])}  "
                     f"{call.action.describe()}{_rules(by)}")
  for kind, i in walker.order:
    if kind == "hook":
      call = calls[i]
      if call.kind == "output":
        continue
      ran.add(call.path)
      seen = sorted(walker.hooks[i], key=lambda p: not p.startswith(call.path))
      weight = seen[0] if seen else f"{call.path}/?"
      site = Site(call.kind, *call.shapes[:2], None, weight)
      sites.append((site, Action(call.action, gemm_rules.get(call.path, ()))))
      continue
    site = walker.sites[i][0]
    sites.append((site, Action(None, (), _why_not(site, found))))
  used = {i for p in found.values() for i in p.matched}
  head, foot = _summary(sites, used, rules, "hook route", type(model).__name__)
  idle = sorted(p for p, plan in found.items() if plan.gemm and p not in ran)
  if idle:
    foot.insert(0, "hooks set but never called: " + ", ".join(
        f"{p or '<root>'} (rules {', '.join(map(str, gemm_rules[p]))})" for p in idle))
  return "\n".join(head + _collapse([site_line(s, a) for s, a in sites]) + outputs + foot)
