"""The data behind the report's figures (``fp8jax.study.comparison.figures``), on the
synthetic sweep with known numbers (``tests.study.test_sweep_report.build``)."""

import types

import numpy as np
import pytest

from fp8jax.study.comparison import figures
from tests.study import test_sweep_report as synthetic
from tests.study.comparison.test_floor import _log_t


def test_series_is_the_log_t_interval_of_each_checkpoint(res):
  policy = "attn_l0_e4m3"
  steps, mean, lo, hi = figures.series(res, "rel_err", policy)
  np.testing.assert_array_equal(steps, synthetic.STEPS)
  for i in range(len(synthetic.STEPS)):
    want = [synthetic.rel_err(policy, i, j, False) for j in range(len(synthetic.NOISE))]
    assert (mean[i], lo[i], hi[i]) == pytest.approx(_log_t(want), rel=2e-4)


def test_routing_layers_from_the_row_keys(res):
  assert figures.routing_layers(res) == list(range(1, synthetic.LAYERS))
  rows = [{"routing/10/topk_set_diff_frac": 0.1, "routing/3/n_only_a": 0.0},
          {"routing/2/topk_set_diff_frac": 0.2, "rel_err": 0.1}, {}]
  assert figures.routing_layers(types.SimpleNamespace(rows=rows)) == [2, 10]
