"""The engine's entry points for any Flax model: :func:`quantize_model` and :func:`describe`.

    rules = Rules([Rule(r".*mlp/.*", recipes.recipe("fp32_blockwise")),
                   Rule(r"blocks/\\d+/attn", fp8jax.preset("deepseek_v3"))])
    qmodel = quantize_model(model, rules)            # NNX: a quantized copy
    with intercept(rules):                           # Linen: interception while applied
      y = linen_model.apply(variables, x)
    print(describe(model, rules, x))                 # the GEMMs that run, and their actions
    qloss = quantize_gemms(loss, rules)              # any function: every GEMM on a param
"""

from __future__ import annotations

from flax import linen as nn
from flax import nnx

from fp8jax.rules import description, gemms, linen_apply, nnx_apply, recipe_rules
from fp8jax.rules import rule as rule_lib


def quantize_model(model, rules, *, strict: bool = True):
  """An NNX model with ``rules`` applied (a copy; see :mod:`fp8jax.rules.nnx_apply`).
  Linen models are applied inside ``with fp8jax.rules.intercept(rules):`` instead."""
  if isinstance(model, nn.Module):
    raise TypeError("quantize_model: Linen modules are quantized at apply time: call "
                    "model.apply(...) inside `with fp8jax.rules.intercept(rules):`")
  return nnx_apply.quantize_nnx(model, rules, strict=strict)


def plans(model, rules, *args, **kwargs) -> dict[str, rule_lib.Plan]:
  """``{path: Plan}`` of every module: NNX from its graph, Linen by tracing
  ``model.init(key, *args, **kwargs)`` abstractly (example inputs needed)."""
  if isinstance(model, nnx.Module):
    return nnx_apply.plans(model, rules)
  if isinstance(model, nn.Module):
    if not args and not kwargs:
      raise TypeError("describe/plans of a Linen model need example inputs: its modules "
                      "exist only while it runs")
    return linen_apply.linen_plans(model, rules, *args, **kwargs)
  raise TypeError(f"expected a Flax NNX or Linen module, got {type(model).__name__}")


def describe(model, rules, *args, **kwargs) -> str:
  """A report of what ``rules`` do to ``model``.

  With example inputs (arrays or ``jax.ShapeDtypeStruct``), from an abstract trace (no
  FLOPs) of what runs: one line per GEMM (parameter path, op, operand shapes, action:
  the recipe and its rules, or ``not quantized`` and why), the outputs quantized, the
  modules whose parameter GEMMs stay unquantized, hooks set that never ran, and the rules
  that match nothing. ``model`` an NNX or Linen module (the hook route: ``model(*args)``,
  ``model.apply(variables, *args)``), or any function ``fn(params, *inputs)`` (the jaxpr
  route, :func:`fp8jax.rules.quantize_gemms`).

  Without inputs (NNX only), the static plan: one line per module a rule matched
  (``path  gemm[op]: recipe fp32_blockwise | output: ... (rules 0, 2)``; ``unquantized``
  where None actions undo the rest), then each rule that matches no module. It lists the
  hooks set, not the GEMMs that run: a GEMM in the model's own code is not seen.

  Either report ends with a note when the rules give a recipe with BF16 layers and keep
  no layer in BF16 (:func:`fp8jax.rules.recipe_rules.tail_note`).
  """
  rules = rule_lib.as_rules(rules)
  note = recipe_rules.tail_note(rules)
  return "\n".join([_report(model, rules, *args, **kwargs), *([note] if note else [])])


def _report(model, rules: rule_lib.Rules, *args, **kwargs) -> str:
  if isinstance(model, (nnx.Module, nn.Module)) and (args or kwargs):
    return description.hook_report(model, rules, *args, **kwargs)
  if not isinstance(model, (nnx.Module, nn.Module)) and callable(model):
    if not args and not kwargs:
      raise TypeError("describe of a function needs its example inputs, fn(params, "
                      "*inputs) as it is called (arrays or jax.ShapeDtypeStruct): its GEMMs "
                      "are found by tracing it")
    return description.jaxpr_report(gemms.QuantizedGemms(model, rules, strict=False), *args,
                               **kwargs)
  found = plans(model, rules, *args, **kwargs)
  lines = []
  for path, plan in sorted(found.items()):
    if not plan.matched:
      continue
    parts = [f"gemm[{op}]: {description.config_name(c)}" for op, c in plan.gemm]
    if plan.output is not None:
      parts.append(f"output: {plan.output.describe()}")
    parts = parts or ["unquantized"]
    used = ", ".join(map(str, plan.matched))
    lines.append(f"{path or '<root>'}  {' | '.join(parts)}  (rules {used})")
  used = {i for p in found.values() for i in p.matched}
  lines += [f"unmatched: rules[{i}] {r.label()}" for i, r in enumerate(rules) if i not in used]
  lines.append("(the hooks set, not traced: describe(model, rules, *example_inputs) shows the "
               "GEMMs that run)")
  return "\n".join(lines)
