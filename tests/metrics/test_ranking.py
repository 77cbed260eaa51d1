"""fp8jax.metrics.ranking: ranks with ties, Spearman, top-k overlaps and the migration of the
top-k parameters across checkpoints (expectations worked by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8jax import metrics
from fp8jax.models import param_paths


def test_rankdata_and_spearman_with_ties():
  np.testing.assert_array_equal(metrics.rankdata([10, 20, 20, 20, 5]), [2, 4, 4, 4, 1])
  # Ranks [1, 2.5, 2.5, 4] and [1, 4, 2.5, 2.5]: sum dx*dy = 2.25, sum dx² = sum dy² = 4.5.
  assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 2]) == pytest.approx(0.5, abs=1e-12)
  # No ties: 1 - 6 * sum d² / (n (n² - 1)) with d = [3, 0, -2, -1] -> 1 - 84 / 60.
  assert metrics.spearman([4, 3, 2, 1], [1, 3, 4, 2]) == pytest.approx(-0.4, abs=1e-12)
  assert metrics.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
  assert math.isnan(metrics.spearman([1, 1, 1], [1, 2, 3]))


A, B = "layers/0/self_attn/o_proj/kernel", "layers/1/mlp/experts_up"
C, DD = "layers/1/self_attn/q_proj/kernel", "embed_tokens/embedding"


def test_topk_overlap_jaccard_and_ties():
  assert metrics.rank_params({"y": 1.0, "x": 1.0, "z": float("nan"), "w": 3.0}) == [
      "w", "x", "y", "z"]
  assert metrics.top_k({A: 4, B: 3, C: 2, DD: 1}, 2) == [A, B]
  assert metrics.topk_overlap([A, B, C], [B, DD, A], k=2) == 0.5
  assert metrics.topk_overlap([A, B, C], [B, DD, A]) == 2 / 3
  assert metrics.jaccard([A, B], [B, C]) == pytest.approx(1 / 3)
  ds = param_paths.DEEPSEEK
  assert metrics.direct_share_topk({A: 4, B: 3, C: 2}, 2, {("attn_o", None)}, ds) == 0.5
  assert metrics.module_counts([A, B, C], ds) == {
      "attn_o": 1, "routed_experts": 1, "attn_q": 1}


def test_migration_across_checkpoints():
  series = [(0, {A: 4, B: 3, C: 2, DD: 1}), (100, {A: 1, B: 3, C: 4, DD: 2}),
            (200, {A: 1, B: 2, C: 3, DD: 4})]
  rows = metrics.migration(series, k=2, direct=frozenset({("attn_o", None)}),
                           classifier=param_paths.DEEPSEEK)
  assert [r["top"] for r in rows] == [[A, B], [C, B], [DD, C]]
  assert rows[0]["overlap_prev"] is None and rows[0]["direct_share"] == 0.5
  assert rows[1]["overlap_prev"] == 0.5 and rows[1]["jaccard_prev"] == pytest.approx(1 / 3)
  assert rows[1]["spearman_prev"] == pytest.approx(-0.4)
  assert rows[2]["overlap_first"] == 0.0 and rows[2]["jaccard_first"] == 0.0
  assert rows[2]["spearman_first"] == pytest.approx(-1.0)
  assert rows[2]["spearman_prev"] == pytest.approx(0.4)
  assert rows[2]["direct_share"] == 0.0 and rows[2]["topk_modules"] == {
      "embedding": 1, "attn_q": 1}
