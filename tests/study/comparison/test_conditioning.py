"""Conditioning per checkpoint and the spike flags (``fp8jax.study.comparison.conditioning``),
on a synthetic sweep with known numbers (``tests.study.test_sweep_report.build``)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp8jax.study.common import results
from fp8jax.study.comparison import conditioning, questions
from tests.study import test_sweep_report as synthetic
from tests.study.comparison.test_floor import _log_t
from tests.study.test_sweep_report import SEED, build, floor_rel_err


def test_conditioning_and_spike_flags(tmp_path):
  folder = build(tmp_path / "s", policies=SEED[:4], floor=True, grad_norm={100: 10.0},
                 floor_scale={200: 5.0})
  r = results.load(folder)
  sig = conditioning.per_checkpoint(r)
  assert sig[100]["grad_norm"].mean == pytest.approx(10.0)
  assert sig[0]["grad_norm"].mean == pytest.approx(2.0)
  assert sig[0]["loss"].mean == pytest.approx(np.mean([5.0 + 0.01 * j for j in range(4)]))
  want = [floor_rel_err(2, j, 5.0) for j in range(4)]
  got = sig[200]["floor_rel_err"]
  assert (got.mean, got.lo, got.hi) == pytest.approx(_log_t(want), rel=2e-4)
  assert sig[200]["curvature"].mean == pytest.approx(
      2 * scipy_stats.gmean(want) / synthetic.PERTURBATION_NORM)
  flags = conditioning.flags(r)
  assert list(flags) == [100, 200]
  assert flags[100] == ["grad_norm 10 = 5x the median 2"]
  assert [x.split()[0] for x in flags[200]] == ["floor_rel_err", "curvature"]
  assert conditioning.flags(r, factor=6.0) == {}
  assert conditioning.flags(results.load(build(tmp_path / "calm", policies=SEED[:2]))) == {}
  ans = questions.answers(r)
  assert "Flagged checkpoints 100, 200" in ans["format"]["summary"]
  text = "\n".join(conditioning.markdown(r))
  assert "| 100 | 4.51 [4.49, 4.54] | 10 [10, 10] |" in text
  assert "grad_norm 10 = 5x the median 2 |" in text
