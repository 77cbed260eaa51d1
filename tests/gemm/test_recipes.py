"""fp8jax.gemm.recipes: the named GEMM configs, an unknown name's error, and the BF16 tail
layers of a share of a model's layers."""

import pytest

import fp8jax
from fp8jax.gemm import recipes


def test_recipes_by_name():
  assert {"mxfp8", "nvfp4", "nvfp4_recipe", "fp32_blockwise"} <= set(recipes.RECIPES)
  assert all(isinstance(c, fp8jax.GemmConfig) for c in recipes.RECIPES.values())
  assert recipes.recipe("mxfp8") is recipes.RECIPES["mxfp8"]
  assert set(recipes.BF16_TAIL) <= set(recipes.RECIPES)
  with pytest.raises(ValueError, match=r"unknown GEMM recipe 'fp7'; known recipes: \[.*"
                     r"'mxfp8'"):
    recipes.recipe("fp7")


def test_bf16_tail_layers_and_last_layers():
  # 16% of 24 layers is 3.84: 4 layers; a share always keeps at least one layer.
  assert recipes.bf16_tail_layers(0.16, 24) == 4
  assert recipes.bf16_tail_layers(0.16, 2) == 1
  assert recipes.bf16_tail_layers(0.0, 24) == 0
  assert recipes.last_layers(4, 24) == (20, 21, 22, 23)
  assert recipes.last_layers(5, 3) == (0, 1, 2) and recipes.last_layers(0, 3) == ()
