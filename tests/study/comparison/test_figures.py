"""The data behind the report's figures (``fp8jax.study.comparison.figures``), on the
synthetic sweep with known numbers (``tests.study.test_sweep_report.build``)."""

import re
import types

import numpy as np
import pytest

from fp8jax.study.common import results
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


@pytest.mark.parametrize("reference,label", [(None, "BF16"), ("fp32", "FP32")])
def test_the_figures_name_the_reference_by_its_precision(tmp_path, monkeypatch, reference,
                                                         label):
  res = results.load(synthetic.build(tmp_path / "s", policies=synthetic.SEED[:1],
                                     steps=(0, 100), reference=reference))
  drawn = []
  monkeypatch.setattr(figures, "_save", lambda fig, out_dir, name: drawn.append(fig))
  for draw in (figures.loss_curves, figures.grad_error, figures.weight_norms,
               figures.routing):
    draw(res, tmp_path)
  from matplotlib.text import Text  # pylint: disable=import-outside-toplevel
  text = " ".join(t.get_text() for fig in drawn for t in fig.findobj(Text))
  assert f"{label} reference" in text and f"g_{label.lower()}" in text
  other = {"BF16": "FP32", "FP32": "BF16"}[label]
  assert not re.search(f"{other}|g_{other.lower()}", text), text
