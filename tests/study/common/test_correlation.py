"""Rank correlations with Holm's correction (fp8jax/study/common/correlation.py) against
SciPy and a separate loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp8jax.study.common import correlation
from tests.study.common.test_intervals import _holm_loop


def test_correlate_and_holm_family():
  rng = np.random.default_rng(4)
  x = rng.normal(size=30)
  ys = {"strong": x + 0.1 * rng.normal(size=30), "weak": x + 3.0 * rng.normal(size=30),
        "none": rng.normal(size=30)}
  corr = {k: correlation.correlate(x, y, n_boot=500) for k, y in ys.items()}
  corr["short"] = correlation.correlate([1.0, 2.0], [2.0, 1.0])
  for k, y in ys.items():
    assert corr[k]["rho"] == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert corr[k]["lo"] <= corr[k]["rho"] <= corr[k]["hi"]
  assert correlation.adjust(corr) == 3  # "short" has no p-value and is not in the family
  ps = [corr[k]["p"] for k in ("strong", "weak", "none")]
  assert [corr[k]["p_adj"] for k in ("strong", "weak", "none")] == pytest.approx(
      _holm_loop(ps))
  assert correlation.related(corr["strong"]) and not correlation.related(corr["none"])
  assert math.isnan(corr["short"]["p_adj"]) and not correlation.related(corr["short"])
  # a raw p below 0.05 that Holm lifts above it states no relation
  c = {**corr["weak"], "p": 0.02, "p_adj": 0.06}
  assert not correlation.related(c)
