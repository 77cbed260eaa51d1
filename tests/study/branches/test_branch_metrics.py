"""A branch step's metrics (fp8jax/study/branches/branch_metrics.py) against a NumPy float64
reference: divergence, update cosine, routing difference, growth rate, the perturbation and
the record of a non-finite step."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.study.branches import branch_metrics


def _np_tree(rng, shapes):
  return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


@pytest.mark.slow
def test_compare_step_against_float64_reference():
  rng = np.random.default_rng(0)
  shapes = {"layers": {"0": {"self_attn": {"o_proj": {"kernel": (8, 4)}},
                             "mlp": {"down_proj": {"kernel": (6, 8)}}},
                       "1": {"self_attn": {"o_proj": {"kernel": (8, 4)}}}},
            "embed_tokens": {"embedding": (5, 8)}}
  flat_shapes = {}

  def walk(tree, prefix=()):
    for k, v in tree.items():
      if isinstance(v, dict):
        walk(v, (*prefix, k))
      else:
        flat_shapes[(*prefix, k)] = v
  walk(shapes)

  def build(values):
    out: dict = {}
    for path, v in values.items():
      node = out
      for k in path[:-1]:
        node = node.setdefault(k, {})
      node[path[-1]] = jnp.asarray(v)
    return out

  trees = [_np_tree(rng, flat_shapes) for _ in range(4)]  # ref_new, ref_prev, new, prev
  topk = jnp.asarray(rng.integers(0, 4, (2, 3, 2)))
  other = topk.at[0, 0].set(jnp.asarray([3, 2]) if int(topk[0, 0, 0]) < 2 else jnp.asarray([0, 1]))
  counts = jnp.ones((4,), jnp.int32)
  routing = lambda t: {1: {"topk_ids": t, "expert_counts": counts}}  # noqa: E731
  got = jax.device_get(branch_metrics.compare_step(*(build(t) for t in trees),
                                                   routing(topk), routing(other)))
  f64 = [{k: v.astype(np.float64) for k, v in t.items()} for t in trees]
  num = sum(np.sum((f64[2][k] - f64[0][k]) ** 2) for k in flat_shapes)
  den = sum(np.sum(f64[0][k] ** 2) for k in flat_shapes)
  assert float(got["param_div"]) == pytest.approx(math.sqrt(num / den), rel=1e-5)
  d_b = np.concatenate([(f64[2][k] - f64[3][k]).ravel() for k in flat_shapes])
  d_r = np.concatenate([(f64[0][k] - f64[1][k]).ravel() for k in flat_shapes])
  cos = d_b @ d_r / np.linalg.norm(d_b) / np.linalg.norm(d_r)
  assert float(got["update_cos"]) == pytest.approx(cos, rel=1e-5, abs=1e-6)
  keys = [k for k in flat_shapes if k[1] == "0"]
  layer0 = math.sqrt(sum(np.sum((f64[2][k] - f64[0][k]) ** 2) for k in keys)
                     / sum(np.sum(f64[0][k] ** 2) for k in keys))
  assert float(got["by_layer"].column("param_div")["0"]) == pytest.approx(layer0, rel=1e-5)
  changed = np.any(np.sort(np.asarray(topk), -1) != np.sort(np.asarray(other), -1), -1)
  assert float(got["routing_diff"]) == pytest.approx(changed.mean())


def test_growth_rate_and_perturbation():
  assert branch_metrics.growth_rate([math.exp(0.3 * t) * 1e-3 for t in range(6)]) == (
      pytest.approx(0.3))
  assert branch_metrics.growth_rate([1e-3, None, 0.0]) is None
  x = {"w": jnp.linspace(-2.0, 3.0, 1001)}
  a = branch_metrics.perturb(x, jax.random.key(0))
  rel = np.abs(np.asarray(a["w"]) / np.asarray(x["w"]) - 1)
  assert np.all(rel <= 2**-8 * (1 + 1e-6)) and np.mean(rel) > 2**-10
  np.testing.assert_array_equal(a["w"], branch_metrics.perturb(x, jax.random.key(0))["w"])


def test_record_of_a_nonfinite_step_names_it_and_keeps_no_loss():
  from fp8jax.metrics.table import Table  # pylint: disable=import-outside-toplevel
  m = {"loss": np.float32(np.nan), "finite": False,
       "finite_groups": {"params": {"w": True}, "grads": {"w": False}}}
  cmp = {"param_div": 0.01, "update_cos": np.nan, "routing_diff": 0.1,
         "routing_by_layer": {1: 0.1},
         "by_module": Table(["attn_o"], {"param_div": np.array([0.01])}),
         "by_layer": Table(["0"], {"param_div": np.array([0.01])})}
  rec = branch_metrics.record(3, m, 2.5, cmp)
  assert rec["nonfinite"] == "step 3: grads/w" and rec["loss"] is None
  assert rec["loss_gap"] is None and rec["update_cos"] is None and rec["routing_diff"] is None
  assert rec["param_div"] == 0.01  # the skipped step left the params as they were
