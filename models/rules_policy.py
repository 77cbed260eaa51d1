"""Policies as text for any model quantized by rules: ``--policy`` on the command line.

    bf16                                   the model in its own precision (no rules)
    gemm:fp32_blockwise                    a GEMM recipe on every hooked matmul
    gemm:mxfp8@layers/\\d+/mlp/.*           ... on the modules whose path fully matches
    gemm:nvfp4_recipe+output:e4m3@head     terms joined by '+'; later terms override
    weight:e5m2@layers/0/attn/q            one operand's spec inside the GEMM recipe
    dgrad_weight:nvfp4                     ... of one backward copy (W^T for Dgrad)

A term is ``ROLE:ACTION[@REGEX]``: ROLE one of :data:`fp8jax.rules.ROLES`; ACTION a
recipe of :mod:`fp8jax.gemm.recipes` (or ``none``) for ``gemm``, a spec as
:func:`fp8jax.models.policy.parse_spec` reads it (or ``none`` for ``output`` and the
backward copies ``dgrad_weight``, ``wgrad_input``, ``wgrad_grad``: their role's spec) for
the others; REGEX a module path that must match whole (``re.fullmatch``; default ``.*``,
every module). A ``+`` separates terms only where a ``ROLE:`` follows it, so a regex may
hold ``\\d+``. A recipe that keeps its last layers in BF16 (``recipes.BF16_TAIL``) gets
them as ``none`` GEMM rules on the model's last layers (:class:`fp8jax.rules.Recipe`),
where the model says how its layers are named (``layer_path``); a model that does not is
refused such a recipe, never silently given it without its tail.

A model that names the modules of its site grid (``sites``: ``{"attn": "layers/{i}/attn",
"mlp": "layers/{i}/mlp"}``, each module's path in layer ``{i}``) gets the site grid's
cells as ``output`` terms (:func:`site_grid`; delayed vs current scaling on them:
:func:`delayed_grid`), and a policy whose ``output`` rule quantizes
exactly one such module on consecutive layers, in a cell's format, gets that cell in its
record, whatever its text (:func:`site_cell`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
import dataclasses
import re

import fp8jax
from fp8jax.gemm import recipes
from fp8jax.models import api, policy_grid, policy_record
from fp8jax.models import policy as policy_lib
from fp8jax.numerics.roles import OVERRIDES
from fp8jax.rules import ROLES, Recipe, Rule, Rules

_SPLIT = re.compile(r"\+(?=\s*(?:" + "|".join(ROLES) + r"):)")
BASELINE = "bf16"


def _action(role: str, text: str, term: str):
  if text.lower() == "none":
    if role not in ("gemm", "output", *OVERRIDES):
      raise ValueError(f"policy term {term!r}: role {role!r} takes a spec, not 'none'")
    return None
  if role == "gemm":
    return recipes.recipe(text)
  try:
    return policy_lib.parse_spec(text)
  except ValueError as e:
    raise ValueError(f"policy term {term!r}: {e}") from None


def tail_rules(name: str, num_layers: int, layer_path: str | None, expr: str) -> list[Rule]:
  """``none`` GEMM rules on the last layers that recipe ``name`` keeps in BF16 (its share
  of ``num_layers``, :meth:`fp8jax.rules.Recipe.rules`; ``layer_path``: the regex of layer
  ``{i}``'s modules, e.g. ``"layers/{i}/.*"``)."""
  recipe = Recipe.named(name)
  if recipe.bf16_tail and (not layer_path or num_layers < 1):
    raise ValueError(f"policy {expr!r}: the recipe {name!r} keeps its last "
                     f"{recipe.bf16_tail:.0%} of layers in BF16, and this model does not name "
                     "its layers; give its modules explicitly (gemm:NAME@REGEX, then "
                     "gemm:none@REGEX for the layers to keep in BF16)")
  return list(recipe.rules(num_layers, layer_path))[1:]


def parse(text: str, num_layers: int = 0, layer_path: str | None = None) -> api.Variant:
  """The :class:`fp8jax.models.api.Variant` of the policy text ``text`` (see the module
  docstring), named ``text``, with its policy record (:mod:`fp8jax.models.policy_record`:
  the output terms as sites, a single ``gemm:NAME`` term's recipe with its BF16 layers);
  ``noise(TEXT)`` is the noise-matched control of TEXT (:func:`noise_control`).
  ``num_layers`` and ``layer_path``: how the model's layers are named, for recipes with
  BF16 layers."""
  if not isinstance(text, str):
    raise TypeError(f"a policy must be text, got {type(text).__name__} {text!r}")
  expr = text.strip()
  if expr.startswith("noise(") and expr.endswith(")"):
    return noise_control(parse(expr[len("noise("):-1], num_layers, layer_path))
  if expr.lower() == BASELINE:
    return api.Variant(BASELINE, Rules([]), BASELINE,
                       policy_record.build(BASELINE, BASELINE))
  rules, terms, recipes_named = [], [], []
  for term in (t.strip() for t in _SPLIT.split(expr)):
    head, colon, rest = term.partition(":")
    if not colon or head not in ROLES:
      raise ValueError(f"bad policy term {term!r} in {expr!r}: use ROLE:ACTION[@REGEX] "
                       f"with ROLE one of {ROLES}, e.g. gemm:fp32_blockwise or "
                       "output:e4m3@head, or 'bf16'")
    action_text, at, regex = rest.partition("@")
    action = _action(head, action_text.strip(), term)
    terms.append(Rule(regex.strip() if at else ".*", action, role=head))
    rules.append(terms[-1])
    if head == "gemm" and action is not None:
      recipes_named.append(action_text.strip())
      rules += tail_rules(action_text.strip(), num_layers, layer_path, expr)
  return api.Variant(expr, Rules(rules), expr, _record(expr, terms, recipes_named, num_layers))


def _noise_action(action, name: str):
  if isinstance(action, fp8jax.QuantSpec):
    return policy_lib.noise_spec(action, True)
  return policy_lib.noise_gemm(action, True, name)


def noise_control(variant: api.Variant) -> api.Variant:
  """The noise-matched control of a rules policy, named ``noise(<its name>)``: every
  quantization its rules make (outputs, operands, their cotangents, the GEMM recipes'
  roles) keeps its blocks and replaces its rounding error by unbiased random noise of the
  same energy per block (:mod:`fp8jax.quant.noise_control`; DeepSeek-MoE's policies:
  :func:`fp8jax.models.policy.noise_policy`). Its record is the policy's, marked
  ``noise`` and with no site-grid cell."""
  if variant.control_of is not None:
    raise ValueError(f"policy {variant.name!r} is already a noise-matched control")
  if not any(r.action is not None for r in variant.rules):
    raise ValueError(f"policy {variant.name!r} quantizes nothing: it has no noise-matched "
                     "control")
  name, expr = f"noise({variant.name})", f"noise({variant.expr or variant.name})"
  rules = Rules([r if r.action is None
                 else dataclasses.replace(r, action=_noise_action(r.action, variant.name))
                 for r in variant.rules])
  record = variant.record or policy_record.of_rules(variant.name, variant.rules, variant.expr)
  record = {**record, "name": name, "expr": expr, "noise": True, "cell": None}
  return api.Variant(name, rules, expr, record, control_of=variant.name)


def _record(expr: str, terms: list[Rule], named: list[str], num_layers: int) -> dict:
  """The record of the policy text ``expr`` (its term rules ``terms``, ``named`` the
  recipes of its ``gemm`` terms): :func:`~fp8jax.models.policy_record.of_rules`, the
  recipe named by the text and its BF16 layers on a model of ``num_layers`` layers."""
  record = policy_record.of_rules(expr, terms, expr)
  gemm = record["gemm"]
  if gemm is not None and gemm["recipe"] is not None and len(named) == 1:
    recipe = Recipe.named(named[0])
    gemm.update(recipe=recipe.name, bf16_layers=list(recipe.bf16_layers(num_layers)))
  return record


def site_regex(template: str, layers: Iterable[int]) -> str:
  """The module path regex of the module ``template`` (its path in layer ``{i}``) in each
  of ``layers``: ``layers/(0|1|2)/attn``."""
  run = [str(int(i)) for i in layers]
  one = run[0] if len(run) == 1 else "(" + "|".join(run) + ")"
  return re.escape(template).replace(re.escape("{i}"), one)


def site_grid(sites: Mapping[str, str], num_layers: int) -> dict[str, str]:
  """``{cell name: policy text}``: each module of ``sites`` quantized at its output, per
  tensor, on layer 0 and on every layer, in each format of the site grid
  (:mod:`fp8jax.models.policy_grid`'s names: ``mlp_l0-1_e4m3`` ->
  ``output:e4m3@layers/(0|1)/mlp``)."""
  every = f"0-{num_layers - 1}"
  return {policy_grid.cell_name(module, depth, fmt): f"output:{fmt}@{site_regex(template, layers)}"
          for module, template in sites.items()
          for depth, layers in (("0", [0]), (every, range(num_layers)))
          for fmt in policy_grid.FORMATS}


def delayed_grid(sites: Mapping[str, str], num_layers: int) -> dict[str, str]:
  """``{cell name: policy text}``: delayed vs current scaling on the site grid's modules and
  depths, as :func:`fp8jax.models.policy_grid.delayed_grid` for DeepSeek-MoE: each module
  of ``sites`` on layer 0 and on every layer, in E4M3 per tensor with current scaling
  (``attn_l0_e4m3``: ``output:e4m3@layers/0/attn``) and with Transformer Engine's delayed
  scaling (``attn_l0_e4m3_delayed``: ``output:e4m3/delayed(h=1024,reduce=max,margin=0)@...``),
  straight-through backward."""
  every = f"0-{num_layers - 1}"
  return {policy_grid.cell_name(module, depth, "e4m3", scaling):
          f"output:e4m3{suffix}@{site_regex(template, layers)}"
          for module, template in sites.items()
          for depth, layers in (("0", [0]), (every, range(num_layers)))
          for scaling, suffix in policy_grid.SCALINGS.items()}


def site_cell(rules: Rules, sites: Mapping[str, str], module_paths: Iterable[str],
              num_layers: int) -> dict | None:
  """The site grid's cell that ``rules`` compute on a model of these module paths and
  ``sites``: one ``output`` rule whose regex matches exactly the module of one site on
  consecutive layers (no other module), with a cell format's spec; else None."""
  if len(rules) != 1 or rules[0].role != "output" or rules[0].action is None:
    return None
  rule = rules[0]
  fmt = next((f for f in policy_grid.FORMATS if rule.action == policy_lib.parse_spec(f)), None)
  if fmt is None:
    return None
  matched = {p for p in module_paths if rule.matches(p)}
  for module, template in sites.items():
    paths = {i: template.replace("{i}", str(i)) for i in range(num_layers)}
    layers = [i for i, path in paths.items() if path in matched]
    if not layers or matched != {paths[i] for i in layers}:
      continue
    lo, hi = layers[0], layers[-1]
    if layers != list(range(lo, hi + 1)):
      return None
    return {"module": module, "depth": f"l{lo}" if lo == hi else f"l{lo}-{hi}", "format": fmt}
  return None
