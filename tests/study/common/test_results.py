"""fp8jax.study results and statistics on a synthetic sweep folder with known numbers
(the builder of ``tests/study/test_sweep_report.py``): loading, torn lines and bad rows, the
t-intervals against SciPy, seed-policy names."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp8jax.study.common import results, stats
from tests.study.test_sweep_report import BAD_WHERE, SEED, STEPS, build, rel_err


def test_load_round_trip(sweep, res):
  assert res.meta == json.loads((sweep / "meta.json").read_text())
  assert res.policies == SEED and res.steps == list(STEPS)
  written = (sweep / "rows.jsonl").read_text().splitlines()
  assert [json.dumps(r) for r in res.rows] == written  # NaN survives as NaN
  assert len(res.details) == len(res.rows) == len(SEED) * len(STEPS) * 4
  assert len(res.baseline) == 16 and len(res.weights) == 4
  assert [(r["step"], r["policy"], r["nonfinite"]) for r in res.nonfinite()] == [
      (100, "moe_l0-8_e5m2", BAD_WHERE)]


def test_load_torn_lines_and_errors(tmp_path):
  folder = build(tmp_path / "s", policies=("attn_l0_e4m3",), steps=(0, 100))
  n = len(results.load(folder).rows)
  good = (folder / "rows.jsonl").read_text()
  for name in ("rows", "details", "baseline", "weights"):
    with open(folder / f"{name}.jsonl", "a") as f:
      f.write('{"step": 0, "offset"')  # a killed writer's torn last line
  assert len(results.load(folder).rows) == n
  lines = (folder / "details.jsonl").read_text().splitlines()
  (folder / "details.jsonl").write_text("\n".join([lines[0], "{torn", *lines[1:]]) + "\n")
  with pytest.raises(ValueError, match="details.jsonl:2"):
    results.load(folder)
  (folder / "details.jsonl").write_text("\n".join(lines) + "\n")
  for bad, match in (({"policy": "nope"}, "policy 'nope'"), ({"step": 7}, "step 7")):
    row = {**json.loads(good.splitlines()[0]), **bad}
    (folder / "rows.jsonl").write_text(good + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=match):
      results.load(folder)
  (folder / "rows.jsonl").write_text(good)
  (folder / "weights.jsonl").unlink()
  with pytest.raises(FileNotFoundError, match="weights.jsonl"):
    results.load(folder)


def test_t_quantile_and_mean_ci():
  assert stats.t_quantile(1) == 12.706 and stats.t_quantile(30) == 2.042
  assert stats.t_quantile(31) == pytest.approx(2.0395, abs=1e-4)  # test_intervals.py
  x = np.array([1.0, 2.0, 4.0])
  s = stats.mean_ci(list(x) + [math.nan], n_nonfinite=2)
  half = 4.303 * x.std(ddof=1) / math.sqrt(3)
  assert s.mean == pytest.approx(7 / 3) and s.n == 3
  assert (s.lo, s.hi) == pytest.approx((7 / 3 - half, 7 / 3 + half))
  assert (s.n_undefined, s.n_nonfinite) == (1, 2)
  one = stats.mean_ci([0.5])
  assert one.mean == 0.5 and not one.has_ci and math.isnan(one.lo)
  assert stats.mean_ci([]).n == 0 and math.isnan(stats.mean_ci([]).mean)


def _log_t(x) -> tuple[float, float, float]:
  """Geometric mean and exp of the 95% t-interval of the logs, by SciPy."""
  lx = np.log(x)
  lo, hi = scipy_stats.t.interval(0.95, lx.size - 1, lx.mean(), scipy_stats.sem(lx))
  return scipy_stats.gmean(x), math.exp(lo), math.exp(hi)


def test_summary_matches_scipy_and_excludes_nonfinite(res):
  table = stats.summary(res, "rel_err")
  assert set(table) == {(p, s) for p in SEED for s in STEPS}
  x = np.array([rel_err("attn_l0_e5m2", 2, j, False) for j in range(4)])
  st = table[("attn_l0_e5m2", 200)]
  assert st.log and st.n == 4
  assert (st.mean, st.lo, st.hi) == pytest.approx(_log_t(x), rel=2e-4)  # t table: 3 decimals
  bad = table[("moe_l0-8_e5m2", 100)]  # batch j = 2 (offset 8, batch 0) is non-finite
  x = np.array([rel_err("moe_l0-8_e5m2", 1, j, False) for j in (0, 1, 3)])
  assert (bad.n, bad.n_nonfinite) == (3, 1)
  assert (bad.mean, bad.lo, bad.hi) == pytest.approx(_log_t(x), rel=2e-4)
  cos = stats.stat(res, "cosine", "attn_l0_e5m2", [200])  # signed: arithmetic t-interval
  c = np.array([1 - rel_err("attn_l0_e5m2", 2, j, False) ** 2 / 2 for j in range(4)])
  want = scipy_stats.t.interval(0.95, 3, c.mean(), scipy_stats.sem(c))
  assert not cos.log and cos.mean == pytest.approx(c.mean())
  assert (cos.hi - cos.mean, cos.mean - cos.lo) == pytest.approx(
      (want[1] - c.mean(), c.mean() - want[0]), rel=2e-4)
  pooled = stats.stat(res, "rel_err", "moe_l0-8_e5m2")
  assert pooled.n == 15 and pooled.n_nonfinite == 1 and math.isfinite(pooled.mean)
  over = stats.overall(res, "rel_err", "moe_l0-8_e5m2")
  centers = [table[("moe_l0-8_e5m2", s)].mean for s in STEPS]
  assert over.median == pytest.approx(math.exp(np.median(np.log(centers))))
  assert (over.n_steps, over.n, over.n_nonfinite) == (4, 15, 1)
  assert 0 < over.lo <= over.median <= over.hi


def test_depth_layers():
  assert results.depth_layers("l0") == 1 and results.depth_layers("l0-8") == 9


def test_seed_cells_come_from_the_policy_records_not_the_names():
  """A policy's site-grid cell is what its numerics are (``deepseek_model.policy_meta``
  records it): an expression named by itself is a cell, a site-grid name over other
  numerics is not; an entry written before records reads its expression
  (tests/study/common/test_legacy_records.py)."""
  from fp8jax.models import deepseek_model
  from fp8jax.models import policy as policy_lib
  from fp8jax.study.comparison import questions
  meta = {"policies": {}}
  for name in ("attn@0-8:e5m2", "moe_l0_e4m3", "attn_l0_e4m3", "noise(moe@0:e4m3)"):
    expr = {"attn_l0_e4m3": "attn@0:mxfp8"}.get(name, name)  # the name over other numerics
    meta["policies"][name] = deepseek_model.policy_meta(policy_lib.parse_policy(expr), 9)
  meta["policies"]["moe_l0-8_e5m2"] = {"expr": "moe@0-8:e5m2"}  # an older record: no cell
  res = results.Results(None, meta, [], [], [], [])
  assert res.cell("attn@0-8:e5m2") == ("attn", "l0-8", "e5m2")
  assert res.cell("moe_l0_e4m3") == ("moe", "l0", "e4m3")
  assert res.cell("attn_l0_e4m3") is None and res.cell("noise(moe@0:e4m3)") is None
  assert res.cell("moe_l0-8_e5m2") == ("moe", "l0-8", "e5m2")
  assert questions.site_cells(res) == {("attn", "l0-8", "e5m2"): "attn@0-8:e5m2",
                                      ("moe", "l0", "e4m3"): "moe_l0_e4m3",
                                      ("moe", "l0-8", "e5m2"): "moe_l0-8_e5m2"}
