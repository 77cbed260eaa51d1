"""A named GEMM recipe as rules: its :class:`fp8jax.GemmConfig` and the BF16 layers it keeps.

    nvfp4 = Recipe.named("nvfp4_recipe")               # config + BF16 share 0.16
    rules = nvfp4.rules(num_layers=12, layer_path="layers/{i}/.*",
                        where=r"layers/\\d+/mlp/.*")
    # Rules: the config on the MLPs, then `none` GEMM rules on layers 10 and 11

:func:`fp8jax.recipe` (``fp8jax.gemm.recipes.recipe``) is the GEMM config alone: a
``Rule(path, fp8jax.recipe("nvfp4_recipe"))`` quantizes every matching layer, the last
ones too. A recipe that keeps a share of a model's last layers in BF16
(``fp8jax.gemm.recipes.BF16_TAIL``: the NVFP4 recipe's ~16%) says so only through
:meth:`Recipe.rules`, which needs the model's depth and how its layers are named, and
refuses to leave them out. :func:`tail_note` is what :func:`fp8jax.rules.describe` prints
when rules give such a recipe's config to a model and no layer back to BF16.
"""

from __future__ import annotations

import dataclasses

from fp8jax.gemm import recipes
from fp8jax.gemm.dense import GemmConfig
from fp8jax.rules.rule import Rule, Rules


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A GEMM recipe with its BF16 layers.

  Attributes:
    name: the recipe's name (a key of ``fp8jax.gemm.recipes.RECIPES`` for a named one).
    config: its GEMM config.
    bf16_tail: the share of a model's last layers whose GEMMs stay in BF16, in [0, 1).
  """

  name: str
  config: GemmConfig
  bf16_tail: float = 0.0

  def __post_init__(self):
    if not isinstance(self.config, GemmConfig):
      raise TypeError(f"recipe {self.name!r}: config must be a GemmConfig, got "
                      f"{type(self.config).__name__}")
    if not 0.0 <= self.bf16_tail < 1.0:
      raise ValueError(f"recipe {self.name!r}: bf16_tail is a share of the layers in [0, 1), "
                       f"got {self.bf16_tail}")

  @classmethod
  def named(cls, name: str) -> Recipe:
    """The recipe ``name`` of ``fp8jax.gemm.recipes`` with its BF16 share (ValueError
    listing the known names for an unknown one)."""
    return cls(name, recipes.recipe(name), recipes.BF16_TAIL.get(name, 0.0))

  def bf16_layers(self, num_layers: int) -> tuple[int, ...]:
    """The indices of the last layers of ``num_layers`` kept in BF16
    (:func:`fp8jax.gemm.recipes.bf16_tail_layers` of them; () without a share)."""
    return recipes.last_layers(recipes.bf16_tail_layers(self.bf16_tail, num_layers),
                               num_layers)

  def rules(self, num_layers: int = 0, layer_path: str | None = None, where: str = ".*",
            op: str | None = None) -> Rules:
    """The recipe as rules: ``Rule(where, config, op=op)``, then a ``none`` GEMM rule on
    each BF16 layer's modules, ``layer_path.format(i=i)`` (e.g. ``"layers/{i}/.*"``).

    Raises:
      ValueError: the recipe has BF16 layers and ``layer_path`` or ``num_layers`` (>= 1)
        is missing, or ``layer_path`` has no ``{i}``.
    """
    out = [Rule(where, self.config, role="gemm", op=op)]
    if not self.bf16_tail:
      return Rules(out)
    if not layer_path or num_layers < 1 or "{i}" not in layer_path:
      raise ValueError(
          f"recipe {self.name!r} keeps its last {self.bf16_tail:.0%} of layers in BF16: give "
          f"num_layers and layer_path (the regex of layer {{i}}'s modules, e.g. "
          f"'layers/{{i}}/.*'), got num_layers={num_layers}, layer_path={layer_path!r}")
    return Rules([*out, *(Rule(layer_path.format(i=i), None, role="gemm")
                          for i in self.bf16_layers(num_layers))])


def tail_note(rules: Rules) -> str | None:
  """A one-line note when ``rules`` give a GEMM the config of a recipe with BF16 layers and
  no rule gives any GEMM back to BF16 (the recipe's tail left out); None otherwise."""
  if any(r.role == "gemm" and r.action is None for r in rules):
    return None
  configs = {r.action for r in rules if r.role == "gemm" and r.action is not None}
  tailed = [n for n, c in recipes.RECIPES.items() if c in configs and recipes.BF16_TAIL.get(n)]
  if not tailed:
    return None
  alike = [n for n, c in recipes.RECIPES.items() if c in configs and n not in tailed]
  also = f" (or {', '.join(alike)}, the same config without BF16 layers)" if alike else ""
  return (f"note: recipe {tailed[0]}{also} keeps its last {recipes.BF16_TAIL[tailed[0]]:.0%} "
          "of a model's layers in BF16; these rules keep none: use "
          f"fp8jax.rules.Recipe.named({tailed[0]!r}).rules(num_layers, layer_path)")
