"""fp8jax.metrics.rows: a gradient comparison's result as long-form rows, one flat row, a
module x layer heatmap and per-parameter values (on the hand-worked case of
``tests/metrics/test_metrics.py``)."""

import math

import pytest

from fp8jax import metrics
from tests.metrics.test_metrics import _COMPARE, DS, E, _hand_case


def test_rows_heatmap_and_per_param():
  gb, gf, mask_b, mask_f = _hand_case()
  res = _COMPARE(gb, gf, mask_b, mask_f)
  rows = metrics.to_rows(res, {"step": 3}, classifier=DS)
  assert rows[0]["scope"] == "global" and rows[0]["step"] == 3
  assert all(isinstance(v, (float, int, str, type(None))) for r in rows for v in r.values())
  layers = [r["layer"] for r in rows if r["scope"] == "layer"]
  assert layers == [0, 1, 2, None]
  experts = [r for r in rows if r["scope"] == "expert" and r["layer"] == 1]
  assert [r["expert"] for r in experts] == list(range(E))
  assert experts[2]["diff_norm"] == pytest.approx(math.sqrt(54), rel=1e-6)
  flat = metrics.flat_row(res, {"step": 3})
  assert flat["module/attn_o/diff_norm"] == pytest.approx(1.5, rel=1e-6)
  assert flat["diff_norm"] == pytest.approx(math.sqrt(104.25), rel=1e-6)
  modules, layer_ids, table = metrics.heatmap(res, classifier=DS)
  assert layer_ids == [0, 1, 2] and "embedding" not in modules
  assert table[modules.index("attn_o"), 0] == pytest.approx(1.5, rel=1e-6)
  assert math.isnan(table[modules.index("router"), 0])  # layer 0 is dense
  values = metrics.per_param(res)
  assert metrics.top_k(values, 1) == ["layers/1/mlp/experts_gate"]
