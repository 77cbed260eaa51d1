"""fp8jax.metrics: routing divergence, and the gradient and routing metrics of the tiny model
against itself.

Routing expectations are worked by hand (rankings: ``tests/metrics/test_ranking.py``); the
paired gradient comparison is tested against float64 NumPy in
``tests/metrics/test_metrics.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax import metrics
from fp8jax.models import config as mc
from fp8jax.models import deepseek_moe as dm
from fp8jax.models import param_paths
from fp8jax.models import policy as pl

# ------------------------------------------------------------------------------- routing


def _routing(ids, n_experts):
  ids = np.asarray(ids, np.int32)
  return {"topk_ids": ids, "expert_counts": np.bincount(ids.ravel(), minlength=n_experts)}


def test_routing_divergence_on_hand_made_topk():
  # Layer 1, 4 tokens (B=2, S=2), k=2, 6 experts: token 0 is a permutation of the same set,
  # token 1 identical, tokens 2 and 3 differ in one expert each.
  a1 = [[[0, 1], [2, 3]], [[1, 0], [3, 2]]]
  b1 = [[[1, 0], [2, 3]], [[1, 2], [4, 3]]]
  # Layer 2, one token: expert 5 only in a, expert 4 only in b.
  a2, b2 = [[[0, 5]]], [[[4, 0]]]
  ra = {1: _routing(a1, 6), 2: _routing(a2, 6)}
  rb = {1: _routing(b1, 6), 2: _routing(b2, 6)}
  div = jax.jit(metrics.routing_divergence)(ra, rb)
  l1 = div[1]
  assert float(l1["topk_set_diff_frac"]) == 0.5 and int(l1["n_tokens_diff"]) == 2
  assert float(l1["topk_ordered_diff_frac"]) == 0.75
  assert float(l1["topk_mean_overlap"]) == 0.75 and int(l1["n_tokens"]) == 4
  # Counts: a [2, 2, 2, 2, 0, 0], b [1, 2, 2, 2, 1, 0].
  assert int(l1["n_only_a"]) == 0 and int(l1["n_only_b"]) == 1
  np.testing.assert_array_equal(l1["only_b"], [0, 0, 0, 0, 1, 0])
  assert int(l1["n_active_a"]) == 4 and int(l1["n_active_b"]) == 5
  l2 = div[2]
  assert float(l2["topk_set_diff_frac"]) == 1.0 and float(l2["topk_mean_overlap"]) == 0.5
  rows = metrics.routing_rows(div, {"step": 7})
  assert [r["layer"] for r in rows] == [1, 2] and rows[0]["step"] == 7
  assert rows[1]["only_a"] == [5] and rows[1]["only_b"] == [4] and rows[0]["only_a"] == []
  same = metrics.routing_divergence(ra, ra)
  assert float(same[1]["topk_set_diff_frac"]) == 0.0 and int(same[2]["n_only_a"]) == 0


# --------------------------------------------------------------------------- tiny model


@pytest.mark.slow
def test_tiny_model_bf16_against_itself_is_exactly_zero():
  cfg = mc.tiny()
  rng = np.random.default_rng(3)
  params = jax.tree.map(lambda s: (0.02 * rng.standard_normal(s.shape)).astype(s.dtype),
                        dm.abstract_params(cfg))
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 8)), jnp.int32)

  def objective(p):
    # The every-expert MoE path compiles faster on CPU; the comparison is the same.
    logits, aux = dm.apply(p, tokens, cfg, pl.BF16, moe_impl="reference")
    return dm.lm_loss(logits, tokens) + aux["aux_loss"], aux["routing"]

  grad_fn = jax.jit(jax.value_and_grad(objective, has_aux=True))
  (loss_a, routing_a), grads_a = grad_fn(params)
  (loss_b, routing_b), grads_b = grad_fn(params)
  compare = functools.partial(metrics.compare_grads, classifier=param_paths.DEEPSEEK)
  res = jax.jit(compare)(grads_a, grads_b, routing_a, routing_b,
                         loss_bf16=loss_a, loss_fp8=loss_b)
  assert float(res["global"]["norm_bf16"]) > 0
  for leaf_group in [res["global"], *res["per_param"].values()]:
    assert float(leaf_group["diff_norm"]) == 0.0
  assert float(res["global"]["cosine"]) == 1.0 and float(res["loss"]["loss_abs_err"]) == 0.0
  assert set(res["by_expert"]) == {"1", "2"}
  assert len(res["per_param"]) == len(jax.tree.leaves(params))
  div = metrics.routing_divergence(routing_a, routing_b)
  assert all(float(d["topk_set_diff_frac"]) == 0.0 for d in div.values())
