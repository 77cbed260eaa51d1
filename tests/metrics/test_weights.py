"""fp8jax.metrics.weights: weight norms per parameter, expert and group of a small hand-made
params tree (integer entries: the norms are worked by hand)."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.metrics import paths, weights

CLS = dataclasses.replace(
    paths.Classifier.from_patterns({"attn": "/attn/", "experts": "/experts$", "head": "^head"},
                                   layer=r"^layers/(\d+)/"),
    is_expert_stack=lambda p: p.endswith("/experts"))


def _params():
  """Squares: attn 25 (layer 0) + 100 (layer 1), experts 5 + 20 (layer 0), head 144."""
  return {"layers": [{"attn": {"kernel": jnp.array([[3.0, 4.0]])},
                      "experts": jnp.array([[1.0, 2.0], [2.0, 4.0]], jnp.bfloat16)},
                     {"attn": {"kernel": jnp.array([[6.0, 8.0]])}}],
          "head": jnp.array([12.0])}


def test_weight_norms_per_parameter_expert_and_group():
  out = jax.jit(weights.weight_norms, static_argnums=1)(_params(), CLS)
  norm = lambda table, key: float(table[key]["weight_norm"])
  assert float(out["global"]["weight_norm"]) == pytest.approx(math.sqrt(294))
  assert norm(out["per_param"], "layers/0/attn/kernel") == pytest.approx(5.0)
  assert norm(out["per_param"], "layers/0/experts") == pytest.approx(5.0)
  assert {k: norm(out["by_module"], k) for k in out["by_module"]} == pytest.approx(
      {"attn": math.sqrt(125), "experts": 5.0, "head": 12.0})
  assert {k: norm(out["by_layer"], k) for k in out["by_layer"]} == pytest.approx(
      {"0": math.sqrt(50), "1": 10.0, "none": 12.0})
  assert norm(out["by_module_layer"], "attn/1") == pytest.approx(10.0)
  assert set(out["by_group"]) == {"other"}  # no groups given
  want = [math.sqrt(5), math.sqrt(20)]
  np.testing.assert_allclose(out["per_expert"]["layers/0/experts"]["weight_norm"], want,
                             rtol=1e-6)
  np.testing.assert_allclose(out["by_expert"]["0"]["weight_norm"], want, rtol=1e-6)
  assert list(out["per_expert"]) == ["layers/0/experts"]


def test_norms_by_module_are_the_module_norms_and_the_global_one():
  got = weights.norms_by_module(_params(), CLS)
  assert {k: float(v) for k, v in got.items()} == pytest.approx(
      {"global": math.sqrt(294), "attn": math.sqrt(125), "experts": 5.0, "head": 12.0})


def test_without_expert_stacks_there_are_no_expert_rows():
  plain = paths.Classifier.from_patterns({"attn": "/attn/"}, layer=r"^layers/(\d+)/")
  out = weights.weight_norms(_params(), plain)
  assert len(out["per_expert"]) == 0 and len(out["by_expert"]) == 0
  assert float(out["by_module"]["other"]["weight_norm"]) == pytest.approx(math.sqrt(169))
