"""The one-step ranking of the recipes against the full runs' gaps
(fp8jax.study.runs.one_step_ranking), against SciPy's Spearman and t-interval."""

import json
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp8jax.study.runs import one_step_ranking, validation

RECIPES = ("gemm:mxfp8", "gemm:mxfp4", "gemm:nvfp4", "gemm:fp8_tensor", "gemm:nvfp4_recipe")


def _sweep(folder, values, steps=(100, 200, 300), floor=0.03, recipes=RECIPES):
  """A sweep folder of ``recipes`` (and the floor, unless ``floor`` is None);
  ``values[(policy, step)]``: rel_err per batch (None: a non-finite row). Step 300 has no
  rows at all."""
  folder.mkdir(parents=True)
  policies = {p: {"expr": p} for p in recipes}
  if floor is not None:
    policies["floor"] = {"expr": "floor", "kind": "floor"}
  meta = {"policies": policies, "steps": list(steps), "windows": {"batches": 2}}
  (folder / "meta.json").write_text(json.dumps(meta))
  rows = []
  for (policy, step), per_batch in values.items():
    for b, v in enumerate(per_batch):
      if policy in recipes:
        rows.append({"step": step, "offset": 0, "batch": b, "policy": policy,
                     "finite": v is not None, "rel_err": math.nan if v is None else v})
  for step in steps[:2] if floor is not None else ():
    rows += [{"step": step, "offset": 0, "batch": b, "policy": "floor", "finite": True,
              "rel_err": floor} for b in range(2)]
  (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  for name in ("details", "baseline", "weights"):
    (folder / f"{name}.jsonl").write_text("")


def _summary(gaps):
  """A validation summary with ``gaps[recipe] = [gap of seed 0, 1, 2]``."""
  recipes = {"bf16": {"verdict": "reference", "gaps": [], "gap_seeds": []}}
  for r, g in gaps.items():
    recipes[r] = {"verdict": "cannot tell", "gaps": list(g), "gap_seeds": [0, 1, 2]}
  return {"recipes": recipes}


def _data(rng):
  per_seed = {}
  for seed in range(3):
    values = {}
    for i, r in enumerate(RECIPES):
      for step in (100, 200):
        values[(r, step)] = list(0.1 * (i + 1) + rng.normal(0, 0.08, 2))
    values[("gemm:nvfp4_recipe", 200)] = []  # not compared at 200 (a partial sweep)
    if seed == 1:
      values[("gemm:fp8_tensor", 100)] = [0.4, None]  # a non-finite row: d is not ranked there
    per_seed[seed] = values
  return per_seed


def test_agreement_matches_scipy(tmp_path):
  rng = np.random.default_rng(0)
  per_seed = _data(rng)
  for seed, values in per_seed.items():
    _sweep(tmp_path / f"s{seed}", values)
  (tmp_path / "notes").mkdir()  # other folders are ignored
  gaps = {r: list(0.002 * (i + 1) + rng.normal(0, 0.002, 3)) for i, r in enumerate(RECIPES)}
  agr = one_step_ranking.agreement(one_step_ranking.load(tmp_path), _summary(gaps), n_boot=200)

  assert agr["recipes"] == list(RECIPES)
  assert list(agr["steps"]) == [100, 200]  # step 300 has no rows: left out
  assert agr["floor"] == {100: pytest.approx(0.03), 200: pytest.approx(0.03)}
  for step in (100, 200):
    got = agr["steps"][step]
    xs, ys = [], []
    for seed in range(3):
      x, y = [], []
      for r in RECIPES:
        v = per_seed[seed][(r, step)]
        ok = v and all(e is not None for e in v)
        x.append(float(np.mean(v)) if ok else math.nan)
        y.append(gaps[r][seed])
      keep = [i for i in range(5) if math.isfinite(x[i])]
      want = scipy_stats.spearmanr([x[i] for i in keep], [y[i] for i in keep]).statistic
      assert got["seeds"][seed]["rho"] == pytest.approx(want)
      assert got["seeds"][seed]["n"] == len(keep)
      assert 0 < got["seeds"][seed]["p"] <= 1
      xs.append(x)
      ys.append(y)
    z = np.arctanh(np.clip([got["seeds"][s]["rho"] for s in range(3)], -0.9999, 0.9999))
    lo, hi = scipy_stats.t.interval(0.95, 2, loc=z.mean(), scale=scipy_stats.sem(z))
    m = got["mean"]
    assert (m["mean"], m["lo"], m["hi"]) == pytest.approx(
        (math.tanh(z.mean()), math.tanh(lo), math.tanh(hi)), rel=1e-3)
    assert -1 <= m["lo"] <= m["hi"] <= 1
    a = np.array(xs)
    n = np.isfinite(a).sum(axis=0)
    x_mean = np.where(n > 0, np.nansum(a, axis=0) / np.maximum(n, 1), np.nan)
    keep = np.isfinite(x_mean)
    want = scipy_stats.spearmanr(x_mean[keep], np.mean(ys, axis=0)[keep]).statistic
    assert got["of_means"]["rho"] == pytest.approx(want)
  assert math.isnan(agr["steps"][200]["x"]["gemm:nvfp4_recipe"])
  assert agr["steps"][100]["x"]["gemm:fp8_tensor"] == pytest.approx(
      np.mean([np.mean(per_seed[s][("gemm:fp8_tensor", 100)]) for s in (0, 2)]))

  md = "\n".join(one_step_ranking.markdown(agr))
  assert "| 100 | 4/5 |" in md and "| 200 | 4 |" in md
  assert "| gemm:nvfp4_recipe | " in md and "| (noise floor) | 0.0300 | 0.0300 | - |" in md


def test_a_seed_in_parts_ranks_as_one_sweep(tmp_path):
  """s<seed>.<part> folders (one process each over some recipes) merge into the seed's
  sweep: the same agreement as from unsplit folders."""
  rng = np.random.default_rng(1)
  per_seed = _data(rng)
  for seed, values in per_seed.items():
    _sweep(tmp_path / "whole" / f"s{seed}", values)
    _sweep(tmp_path / "parts" / f"s{seed}.a", values, recipes=RECIPES[:2])
    _sweep(tmp_path / "parts" / f"s{seed}.b", values, floor=None, recipes=RECIPES[2:])
  gaps = {r: list(0.002 * (i + 1) + rng.normal(0, 0.002, 3)) for i, r in enumerate(RECIPES)}
  whole = one_step_ranking.load(tmp_path / "whole")
  parts = one_step_ranking.load(tmp_path / "parts")
  assert sorted(parts) == [0, 1, 2]
  assert parts[0].policies == list(RECIPES) and parts[0].floor == "floor"
  a = one_step_ranking.agreement(whole, _summary(gaps), n_boot=0)
  b = one_step_ranking.agreement(parts, _summary(gaps), n_boot=0)
  assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_parts_that_do_not_belong_together_are_refused(tmp_path):
  values = _data(np.random.default_rng(2))[0]
  _sweep(tmp_path / "s0.a", values, recipes=RECIPES[:2])
  _sweep(tmp_path / "s0.b", values, recipes=RECIPES[2:])
  assert one_step_ranking.load(tmp_path)[0].floor == "floor"  # a floor in both parts: one
  meta = json.loads((tmp_path / "s0.b" / "meta.json").read_text())
  meta["policies"]["floor2"] = {"expr": "floor", "kind": "floor"}
  (tmp_path / "s0.b" / "meta.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="more than one floor"):
    one_step_ranking.load(tmp_path)
  meta["policies"].pop("floor2")
  meta["windows"] = {"batches": 4}
  (tmp_path / "s0.b" / "meta.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="evaluation windows"):
    one_step_ranking.load(tmp_path)
  meta["windows"] = {"batches": 2}
  meta["policies"]["gemm:mxfp8"] = {"expr": "gemm:mxfp8_ocp"}
  (tmp_path / "s0.b" / "meta.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="'gemm:mxfp8' is defined differently"):
    one_step_ranking.load(tmp_path)


def test_fisher_mean_stays_within_the_unit_interval():
  s = one_step_ranking.fisher_mean([1.0, 0.95, 0.9, math.nan])
  assert s.n == 3 and s.n_undefined == 1
  assert -1 <= s.lo <= s.mean <= s.hi <= 1
  assert one_step_ranking.fisher_mean([0.5]).n == 1


def test_load_names_the_missing_folders(tmp_path):
  with pytest.raises(FileNotFoundError, match="no one-step comparison folders"):
    one_step_ranking.load(tmp_path)


def test_validation_summary_carries_the_ranking(tmp_path):
  """validate's --one_step: the summary holds the agreement and summary.md its table."""
  m = validation.Matrix(("bf16",) + RECIPES[:3], (0, 1, 2))
  for seed in range(3):
    for i, r in enumerate(("bf16",) + RECIPES[:3]):
      run = tmp_path / "runs" / validation.run_name(r, seed)
      run.mkdir(parents=True)
      loss = 2.0 + 0.01 * i + 0.001 * seed
      rows = [{"step": 10 * k, "loss": loss, "lm_loss": loss} for k in range(10)]
      (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
      (run / "config.json").write_text(json.dumps({"policy": r, "seed": seed}))
      (run / "done.json").write_text("{}")
    _sweep(tmp_path / "one_step" / f"s{seed}",
           {(r, 100): [0.1 * (i + 1)] * 2 for i, r in enumerate(RECIPES[:3])})
  summary = validation.summarize(tmp_path, m, one_step=tmp_path / "one_step")
  step = summary["one_step"]["steps"][100]
  assert [step["seeds"][s]["rho"] for s in range(3)] == pytest.approx([1.0, 1.0, 1.0])
  assert "Does the one-step comparison rank the recipes" in (tmp_path / "summary.md").read_text()
  saved = json.loads((tmp_path / "summary.json").read_text())
  assert saved["one_step"]["recipes"] == list(RECIPES[:3])


def test_report_ranks_a_sweep_against_the_mean_gaps(tmp_path):
  """One sweep of no run of the matrix (seed None): set against each recipe's mean gap; the
  report's trajectory section carries the table."""
  from fp8jax.study import sweep_report  # pylint: disable=import-outside-toplevel
  values = {(r, 100): [0.1 * (i + 1), 0.1 * (i + 1) + 0.01] for i, r in enumerate(RECIPES)}
  _sweep(tmp_path / "sweep", values)
  gaps = {r: [0.001 * v, 0.003 * v, 0.002 * v] for v, r in zip((1, 3, 2, 5, 4), RECIPES)}
  agr = one_step_ranking.agreement({None: one_step_ranking.results_lib.load(tmp_path / "sweep")},
                                   _summary(gaps), n_boot=100)
  got = agr["steps"][100]["seeds"][None]
  want = scipy_stats.spearmanr([0.1 * (i + 1) for i in range(5)], [1, 3, 2, 5, 4]).statistic
  assert got["rho"] == pytest.approx(want) and got["n"] == 5
  summary_path = tmp_path / "summary.json"
  summary_path.write_text(json.dumps(_summary(gaps)))
  text = sweep_report.write_report(tmp_path / "sweep", out=tmp_path / "report",
                             validation=summary_path, find_branch=False).read_text()
  assert "does the one-step ranking predict them?" in text
  assert f"| 100 | 5 | mean gap: {want:+.2f} (" in text
