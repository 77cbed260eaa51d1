"""A policy's record: what it quantizes, as JSON that ``meta.json``, checkpoints and the
report read (never a policy's name).

    {"version": 1, "name": "moe_l0-8_e4m3", "expr": "moe_out@0-8:e4m3/tensor",
     "sites": [{"site": "moe_out", "layers": [0, ..., 8], "format": "e4m3",
                "granularity": "per-tensor", "scaling": "current"}],
     "gemm": None, "noise": False,
     "cell": {"module": "moe", "depth": "l0-8", "format": "e4m3"}}

Fields:

* ``name``: the policy's name (a label); ``expr``: its canonical expression, None where
  it has none.
* ``sites``: each fake-quantized output: ``site`` (DeepSeek-MoE's site name, or the module
  path regex of an ``output`` rule), ``layers`` (layer indices; None: all, or a regex's),
  the forward spec's ``format``, ``granularity`` (``Granularity.describe()``) and
  ``scaling`` (``current`` or ``delayed``).
* ``gemm``: None (no GEMM recipe), else ``recipe`` (the named recipe of
  ``fp8jax.gemm.recipes``; None for another config, or several), ``bits`` (the widest
  element format of its operands, in bits; None for several configs), ``layers`` (None:
  every layer), ``bf16_layers`` (the last layers its BF16 share keeps in BF16; [] without
  one; None where the depth is unknown), ``where`` (the module path regex of a rules
  policy's ``gemm`` term; None for DeepSeek-MoE's linear layers).
* ``noise``: a noise-matched control (``noise(EXPR)``, :mod:`fp8jax.quant.noise_control`).
* ``cell``: the site grid's cell the policy computes (``module``, ``depth``, ``format``;
  :func:`fp8jax.models.deepseek_model.site_cell`, whatever the policy's name), else None.

:func:`build` makes one; :func:`fp8jax.models.deepseek_model.policy_record` the record of a
DeepSeek-MoE policy, :func:`fp8jax.models.rules_policy.parse` that of a rules policy's
text, :func:`of_rules` that of rules built in code. It is not
:func:`fp8jax.models.policy.record` (every field of every spec, for a resume's check).
"""

from __future__ import annotations

from collections.abc import Iterable

from fp8jax.gemm import recipes
from fp8jax.gemm.dense import GemmConfig
from fp8jax.numerics.spec import QuantSpec

VERSION = 1
"""The record's schema version (``version``)."""
KEYS = ("version", "name", "expr", "sites", "gemm", "noise", "cell")
"""The keys of every record, in order."""


def site_entry(site: str, layers: Iterable[int] | None, spec: QuantSpec) -> dict:
  """One entry of ``sites``: ``site`` quantized on ``layers`` (None: all) by ``spec``."""
  return {"site": site, "layers": None if layers is None else [int(i) for i in layers],
          "format": spec.format, "granularity": spec.granularity.describe(),
          "scaling": spec.scaling}


def element_bits(config: GemmConfig) -> int:
  """The widest element format among a GEMM config's operand specs, in bits."""
  return max(spec.fmt.bits for spec in config.roles.specs())


def recipe_name(config: GemmConfig, bf16_tail: float | None = None) -> str | None:
  """The name of the named recipe equal to ``config`` (with BF16 share ``bf16_tail``, when
  given: ``nvfp4_recipe`` and ``nvfp4_recipe_no_tail`` share a config), else None."""
  for name, cfg in recipes.RECIPES.items():
    if cfg == config and bf16_tail in (None, recipes.BF16_TAIL.get(name, 0.0)):
      return name
  return None


def gemm_entry(config: GemmConfig, recipe: str | None, layers: Iterable[int] | None = None,
               bf16_layers: Iterable[int] | None = (), where: str | None = None) -> dict:
  """The ``gemm`` field of a policy whose GEMMs run ``config`` (the recipe ``recipe``)."""
  return {"recipe": recipe, "bits": element_bits(config),
          "layers": None if layers is None else [int(i) for i in layers],
          "bf16_layers": None if bf16_layers is None else [int(i) for i in bf16_layers],
          "where": where}


def build(name: str, expr: str | None, sites: Iterable[dict] = (), gemm: dict | None = None,
          noise: bool = False, cell: dict | None = None) -> dict:
  """A record (see the module docstring) from its fields."""
  return {"version": VERSION, "name": str(name), "expr": expr, "sites": list(sites),
          "gemm": gemm, "noise": bool(noise), "cell": cell}


def of_rules(name: str, rules, expr: str | None = None) -> dict:
  """The record of :class:`fp8jax.rules.Rules` built in code: the ``output`` rules as
  sites (``layers`` None), the ``gemm`` rules' config as ``gemm`` (its named recipe when
  one config serves them all, no operand rule changes it and no ``none`` GEMM rule
  follows; ``bf16_layers`` None: unknown)."""
  sites = [site_entry(r.module_path, None, r.action) for r in rules
           if r.role == "output" and r.action is not None]
  gemm_rules = [r for r in rules if r.role != "output"]
  configs = list(dict.fromkeys(r.action for r in gemm_rules
                               if r.role == "gemm" and r.action is not None))
  gemm = None
  if len(configs) == 1:
    plain = all(r.role == "gemm" and r.action is not None for r in gemm_rules)
    paths = {r.module_path for r in gemm_rules}
    gemm = gemm_entry(configs[0], recipe_name(configs[0]) if plain else None, None, None,
                      paths.pop() if plain and len(paths) == 1 else None)
  elif configs:
    gemm = {"recipe": None, "bits": None, "layers": None, "bf16_layers": None, "where": None}
  noise = bool(sites or configs) and all(
      s.noise_control for s in [*(r.action for r in rules if r.role == "output" and r.action),
                                *(spec for c in configs for spec in c.roles.specs())])
  return build(name, expr, sites, gemm, noise)


def check(record: dict, where: str = "record") -> dict:
  """``record`` if it has every key of :data:`KEYS` and a known version; ValueError naming
  ``where`` otherwise (a record written by a later version of this schema)."""
  version = record.get("version") if isinstance(record, dict) else None
  if version != VERSION:
    raise ValueError(f"{where}: a policy record of version {version!r}; this code reads "
                     f"version {VERSION}")
  missing = [k for k in KEYS if k not in record]
  if missing:
    raise ValueError(f"{where}: the policy record lacks {missing}")
  return record
