"""fp8jax.study results on a synthetic sweep folder with known numbers (the builder of
``tests/study/test_sweep_report.py``): loading, torn lines and bad rows, seed-policy names.
(The t-intervals against SciPy: test_stats.py.)"""

from __future__ import annotations

import json

import pytest

from fp8jax.study.common import results
from tests.study.test_sweep_report import BAD_WHERE, SEED, STEPS, build


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
