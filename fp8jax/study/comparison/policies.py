"""The policies of a sweep: the named grids (:data:`GRIDS`; the site grid's cells are
:mod:`fp8jax.models.policy_grid`'s), grids and expressions expanded, and their
``meta.json`` entries (with each policy's record, :mod:`fp8jax.models.policy_record`).

    expand_policies(["sites", "noise(formats)"], num_layers=9)   # 8 + 6 policies
    expression(policy)                                           # "attn_out@0-8:e4m3/tensor"
"""

from __future__ import annotations

import dataclasses

from fp8jax.models import api, deepseek_model, policy_expression, policy_grid, rules_policy

site_grid = policy_grid.site_grid
"""The site grid (:func:`fp8jax.models.policy_grid.site_grid`): ``{name: expression}``."""


def site_grid_small(num_layers: int = 9) -> dict[str, str]:
  """The smallest part of :func:`site_grid` that answers each of the report's module,
  depth and format questions once: all-layer E4M3 MoE output, the cells that differ from
  it in depth (layer 0) and in format (E5M2), and layer-0 attention beside layer-0 MoE.
  The demo's default; its one all-layer E4M3 policy has one noise-matched control."""
  return _small(site_grid(num_layers), num_layers, "attn", "moe")


def _small(full: dict[str, str], num_layers: int, first: str, other: str) -> dict[str, str]:
  """:func:`site_grid_small`'s cells of the grid ``full`` whose modules are ``first``
  (attention) and ``other``."""
  every, cell = f"0-{num_layers - 1}", policy_grid.cell_name
  names = [cell(other, every, "e4m3"), cell(other, "0", "e4m3"), cell(first, "0", "e4m3"),
           cell(other, every, "e5m2")]
  return {name: full[name] for name in names}


def formats_grid(num_layers: int = 9) -> dict[str, str]:
  """The formats grid: every linear layer's GEMMs under each training-precision recipe,
  from FP8 per-tensor down to NVFP4 (BF16 is the reference of every comparison). The
  depth does not change it."""
  del num_layers
  return {"fp8_tensor": "gemm:fp8_tensor", "fp8_blockwise": "gemm:fp32_blockwise",
          "mxfp8": "gemm:mxfp8", "mxfp4": "gemm:mxfp4", "nvfp4": "gemm:nvfp4",
          "nvfp4_recipe": "gemm:nvfp4_recipe"}


delayed_grid = policy_grid.delayed_grid
"""Delayed vs current scaling on the site grid's cells
(:func:`fp8jax.models.policy_grid.delayed_grid`)."""


GRIDS = {"sites": site_grid, "sites_small": site_grid_small, "formats": formats_grid,
         "delayed": delayed_grid}
"""Named policy grids: ``{name: f(num_layers) -> {policy name: expression}}``. A sweep's
``--policies=NAME`` expands to the grid of the model's depth."""

RENAMED = {"seed": "sites"}
"""Grid names that were renamed: refused with the new name."""


def site_controls(policies) -> list[str]:
  """The noise-matched controls (``noise(NAME)``) of the policies among ``policies``
  (expanded :class:`~fp8jax.models.api.Variant` s) whose numerics are an all-layer E4M3
  cell of the site grid (their record's ``cell``, whatever their names): is FP8's error
  worse or better for the gradient than noise of its size?"""
  out = []
  for p in policies:
    cell = (p.record or {}).get("cell")
    if cell and cell["format"] == "e4m3" and cell["depth"].startswith("l0-"):
      out.append(f"noise({p.name})")
  return out


def expand_policies(specs, num_layers) -> list:
  """Policies from names/expressions; a grid name of :data:`GRIDS`
  (e.g. ``"sites"``, the site grid) expands to that grid at the model's depth, and
  ``noise(GRID)`` to the noise-matched control of each of its policies
  (``noise(fp8_blockwise)``, ...: :func:`fp8jax.models.policy.noise_policy`); each an
  :class:`fp8jax.models.api.Variant` (DeepSeek-MoE's:
  :func:`fp8jax.models.deepseek_model.expand`).

  ``num_layers``: DeepSeek-MoE's depth, or a :class:`fp8jax.models.api.Model`: a
  DeepSeek-MoE model's grids expand at its depth; another model parses each spec itself
  (``model.policy``), and expands the grids of :data:`RULES_GRIDS` where it names its
  site modules (``model.sites``)."""
  if isinstance(num_layers, api.Model):
    model = num_layers
    if not deepseek_model.is_deepseek(model):
      out = [p for spec in specs for p in _rules_policies(model, spec.strip())]
      if not out:
        raise ValueError("no policies to compare")
      return out
    num_layers = model.config.num_hidden_layers
  out = []
  for spec in specs:
    spec = spec.strip()
    if spec.removeprefix("noise(").removesuffix(")") in RENAMED:
      old = spec.removeprefix("noise(").removesuffix(")")
      raise ValueError(f"the policy grid {old!r} is now called {RENAMED[old]!r}")
    out.extend(deepseek_model.expand(spec, num_layers, GRIDS))
  if not out:
    raise ValueError("no policies to compare")
  return out


RULES_GRIDS = {"sites": lambda sites, n: rules_policy.site_grid(sites, n),
               "sites_small": lambda sites, n: _small(rules_policy.site_grid(sites, n), n,
                                                      list(sites)[0], list(sites)[-1]),
               "formats": lambda sites, n: formats_grid(n),
               "delayed": lambda sites, n: rules_policy.delayed_grid(sites, n)}
"""The grids of a model quantized by rules: ``{name: f(model.sites, num_layers) ->
{policy name: policy text}}``; the site grids (and ``delayed``) need the model's
``sites``."""


def _rules_policies(model: api.Model, spec: str) -> list:
  """The policies of one spec of a rules model: a grid of :data:`RULES_GRIDS`, a cell of
  its site or delayed grid by name (``attn_l0-1_e4m3``, ``attn_l0_e4m3_delayed``), or the
  model's own policy text;
  ``noise(SPEC)``: the noise-matched controls of SPEC's policies
  (:func:`fp8jax.models.rules_policy.noise_control`)."""
  name = spec.removeprefix("noise(").removesuffix(")")
  if name != spec:
    return [rules_policy.noise_control(p) for p in _rules_policies(model, name)]
  num_layers = getattr(model.config, "num_layers", 0)
  if name in RULES_GRIDS and (model.sites or name == "formats"):
    return [_named_variant(model, cell, text)
            for cell, text in RULES_GRIDS[name](model.sites, num_layers).items()]
  if name in GRIDS:
    raise ValueError(f"the policy grid {spec!r} does not apply to the model {model.name!r}: "
                     "the model names no site modules (api.Model.sites); give its policies "
                     "as its own text, e.g. gemm:fp32_blockwise")
  cells = {**rules_policy.site_grid(model.sites, num_layers),
           **rules_policy.delayed_grid(model.sites, num_layers)} if model.sites else {}
  if spec in cells:
    return [_named_variant(model, spec, cells[spec])]
  return [model.policy(spec)]


def _named_variant(model: api.Model, name: str, text: str):
  """The policy of ``text`` named ``name`` (a grid's cell), its record renamed too."""
  variant = model.policy(text)
  record = None if variant.record is None else {**variant.record, "name": name}
  return dataclasses.replace(variant, name=name, record=record)


def expression(policy) -> str:
  """The policy's canonical expression, which ``parse_policy`` reads back as the same
  rules and GEMM recipe: a Variant's ``expr``, a ``PrecisionPolicy``'s
  (:func:`fp8jax.models.policy_expression.to_expression`)."""
  if isinstance(policy, api.Variant):
    return policy.expr
  return policy_expression.to_expression(policy)
