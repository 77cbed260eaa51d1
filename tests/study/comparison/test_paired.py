"""The paired BF16 / FP8 gradient evaluation (``fp8jax.study.comparison.paired``): the
variant pass (``paired._result``) reads the gradient's finiteness from the comparison's
probe and names the first non-finite leaf."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax import metrics
from tests.metrics.test_metrics import DS, _hand_case


@pytest.mark.slow
def test_variant_pass_attributes_the_first_nonfinite_leaf():
  from fp8jax.study.comparison import paired
  gb, gf, _, _ = _hand_case()
  paths = list(metrics.paths.flatten(gf))
  leaves = [np.array(v) for v in jax.tree.leaves(gf)]
  for i in (3, len(leaves) - 1):
    poisoned = [v.copy() for v in leaves]
    poisoned[i].flat[0] = np.nan
    tree = jax.tree_util.tree_unflatten(jax.tree.structure(gf), poisoned)
    base = paired.Baseline(jnp.float32(1), None, None, gb, None, {}, True, -1)
    out = paired._result(base, jnp.float32(1), 1.0, 0.0, {}, tree, None, DS)
    assert not bool(out["finite"]) and int(out["nonfinite"]) == i, paths[i]
    assert "fp8_sq_finite" not in out["compare"]
  out = paired._result(base, jnp.float32(1), 1.0, 0.0, {}, gf, None, DS)
  assert bool(out["finite"]) and int(out["nonfinite"]) == -1
  out = paired._result(base, jnp.float32(np.inf), 1.0, 0.0, {}, gf, None, DS)
  assert not bool(out["finite"]) and int(out["nonfinite"]) == -1
  huge = jax.tree.map(lambda v: np.full_like(v, 1e30), gf)  # finite, but its squares are not
  out = paired._result(base, jnp.float32(1), 1.0, 0.0, {}, huge, None, DS)
  assert bool(out["finite"]) and int(out["nonfinite"]) == -1


def test_the_evaluator_takes_a_model_not_a_config():
  from fp8jax.models import config as mc  # pylint: disable=import-outside-toplevel
  from fp8jax.study.comparison import paired  # pylint: disable=import-outside-toplevel
  from fp8jax.train import mesh as mesh_lib  # pylint: disable=import-outside-toplevel

  with pytest.raises(TypeError, match="fp8jax.models.api.Model .* got ModelConfig"):
    paired.PairedEvaluator(mc.tiny(), [], mesh_lib.data_mesh(jax.devices()[:1]))
