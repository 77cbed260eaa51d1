"""A named recipe as rules on a user's model: its BF16 layers come with it
(fp8jax.rules.Recipe), and describe() says when rules leave them out."""

from flax import nnx
import jax
import jax.numpy as jnp
import pytest

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.gemm import recipes
from fp8jax.rules import Recipe, Rule, Rules

LAYERS = 12


class Stack(nnx.Module):
  """A user's model: ``LAYERS`` linear blocks named ``blocks/{i}``, then a head."""

  def __init__(self, rngs):
    self.blocks = nnx.List([nnx.Linear(16, 16, rngs=rngs) for _ in range(LAYERS)])
    self.head = nnx.Linear(16, 4, rngs=rngs)

  def __call__(self, x):
    for block in self.blocks:
      x = x + block(x)
    return self.head(x)


def _gemms(model, rules) -> dict[str, str | None]:
  """``{module path: recipe name or None}`` of the dense GEMMs the rules set."""
  name = {c: n for n, c in reversed(recipes.RECIPES.items())}
  return {p: name.get(plan.config("dot_general")) if plan.config("dot_general") else None
          for p, plan in rules_lib.plans(model, rules).items() if p}


def test_the_recipe_yields_its_bf16_layers_on_a_users_model():
  model = Stack(nnx.Rngs(0))
  nvfp4 = Recipe.named("nvfp4_recipe")
  assert (nvfp4.config, nvfp4.bf16_tail) == (recipes.recipe("nvfp4_recipe"), 0.16)
  assert nvfp4.bf16_layers(LAYERS) == (10, 11)  # round(0.16 * 12) = 2
  rules = nvfp4.rules(LAYERS, "blocks/{i}", where=r"blocks/\d+")
  assert [(r.module_path, r.action is None) for r in rules] == [
      (r"blocks/\d+", False), ("blocks/10", True), ("blocks/11", True)]
  want = {f"blocks/{i}": None if i >= 10 else "nvfp4_recipe" for i in range(LAYERS)}
  assert _gemms(model, rules) == {**want, "blocks": None, "head": None}
  # the config alone quantizes the last layers too: describe() says so
  alone = Rules([Rule(r"blocks/\d+", nvfp4.config)])
  assert _gemms(model, alone)["blocks/11"] == "nvfp4_recipe"
  x = jnp.ones((2, 16))
  note = rules_lib.describe(model, alone).splitlines()[-1]
  assert note.startswith("note: recipe nvfp4_recipe (or nvfp4_recipe_no_tail, the same "
                         "config without BF16 layers) keeps its last 16%")
  assert "Recipe.named('nvfp4_recipe').rules(num_layers, layer_path)" in note
  assert "note:" not in rules_lib.describe(model, rules, x)
  assert "note:" not in rules_lib.describe(model, Rules([Rule(".*", recipes.recipe("mxfp8"))]))
  y = jax.jit(lambda m, x: m(x))(fp8jax.quantize_model(model, rules), x)
  assert y.shape == (2, 4)


def test_a_recipe_without_bf16_layers_needs_no_layer_names():
  assert list(Recipe.named("mxfp8").rules()) == [Rule(".*", recipes.recipe("mxfp8"))]
  assert Recipe.named("nvfp4_recipe_no_tail").bf16_layers(LAYERS) == ()
  for kwargs in ({}, {"num_layers": LAYERS}, {"num_layers": LAYERS, "layer_path": "blocks"}):
    with pytest.raises(ValueError, match="recipe 'nvfp4_recipe' keeps its last 16% of layers "
                                         "in BF16: give num_layers and layer_path"):
      Recipe.named("nvfp4_recipe").rules(**kwargs)
  with pytest.raises(ValueError, match="unknown GEMM recipe 'nope'"):
    Recipe.named("nope")
  with pytest.raises(ValueError, match="bf16_tail is a share of the layers in \\[0, 1\\)"):
    Recipe("x", recipes.recipe("mxfp8"), 1.0)
  with pytest.raises(TypeError, match="action must be a GemmConfig or QuantSpec"):
    Rule(".*", Recipe.named("nvfp4_recipe"))  # a recipe is several rules, never one
