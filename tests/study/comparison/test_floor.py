"""The noise floor, the noise-matched controls and the conditioning in the report, on
synthetic sweep folders with known numbers (tests/study/test_sweep_report.py's builder)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp8jax.study import sweep_report
from fp8jax.study.common import results, stats
from fp8jax.study.comparison import figures, floor, questions
from tests.study import test_sweep_report as synthetic
from tests.study.test_sweep_report import SEED, STEPS, build, floor_rel_err, rel_err

LESS = (2.0, 2.2, 1.8, 2.1)  # control rel_err / policy rel_err per batch: policy below noise
MORE = (0.5, 0.55, 0.45, 0.52)  # policy above noise
SAME = (1.3, 0.8, 1.2, 0.75)  # straddles 1: cannot tell
CONTROLS = {"attn_l0_e4m3": LESS, "attn_l0_e5m2": MORE, "moe_l0_e4m3": SAME}


def ten_times_floor(i: int, j: int) -> float:
  return 10 * floor_rel_err(i, j) * synthetic.NOISE[j]


@pytest.fixture(scope="module")
def res(tmp_path_factory):
  folder = build(tmp_path_factory.mktemp("floor") / "s", floor=True, controls=CONTROLS,
                 extra={"same_as_floor": floor_rel_err, "ten_times_floor": ten_times_floor})
  return results.load(folder)


def _log_t(x) -> tuple[float, float, float]:
  lx = np.log(np.asarray(x, np.float64))
  lo, hi = scipy_stats.t.interval(0.95, lx.size - 1, lx.mean(), scipy_stats.sem(lx))
  return float(np.exp(lx.mean())), math.exp(lo), math.exp(hi)


def test_floor_and_controls_apart_from_the_policies(res, tmp_path):
  assert res.policies == [*SEED, "same_as_floor", "ten_times_floor"]
  assert res.floor == "floor" and res.kind("floor") == "floor"
  assert res.controls == {f"noise({p})": p for p in CONTROLS}
  assert res.control_for("attn_l0_e4m3") == "noise(attn_l0_e4m3)"
  assert res.control_for("moe_l0_e5m2") is None
  assert len(res.names) == len(res.policies) + 1 + len(CONTROLS)
  # The questions see the policies only: the same answers as without floor and controls.
  plain = results.load(build(tmp_path / "plain"))
  with_floor = results.load(build(tmp_path / "floor", floor=True, controls=CONTROLS))
  for key in ("module", "depth", "format"):
    assert (questions.answers(with_floor)[key]["summary"]
            == questions.answers(plain)[key]["summary"])


@pytest.mark.parametrize("change,match", [
    (lambda m: m["policies"]["floor"].update(kind="noise"), "kind 'noise'"),
    (lambda m: m["policies"]["noise(attn_l0_e4m3)"].update(control_of="nope"),
     "control_of 'nope'"),
    (lambda m: m["policies"]["attn_l0_e5m2"].update(kind="floor"), "more than one floor")])
def test_meta_kinds_are_checked(tmp_path, change, match):
  folder = build(tmp_path / "s", policies=("attn_l0_e4m3", "attn_l0_e5m2"), steps=(0,),
                 floor=True, controls={"attn_l0_e4m3": LESS})
  meta = json.loads((folder / "meta.json").read_text())
  change(meta)
  (folder / "meta.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match=match):
    results.load(folder)


def test_floor_multiples_match_scipy(res):
  m = floor.multiples(res, "attn_l0_e5m2")
  for i, s in enumerate(STEPS):
    want = [rel_err("attn_l0_e5m2", i, j, False) / floor_rel_err(i, j) for j in range(4)]
    got = m["per_step"][s]
    assert got.log and got.n == 4
    assert (got.mean, got.lo, got.hi) == pytest.approx(_log_t(want), rel=2e-4)
  centers = [m["per_step"][s].mean for s in STEPS]
  assert m["overall"].median == pytest.approx(math.exp(np.median(np.log(centers))))
  assert 0 < m["overall"].lo <= m["overall"].median <= m["overall"].hi
  # the non-finite row of moe_l0-8_e5m2 is left out of its multiples
  bad = floor.multiples(res, synthetic.BAD["policy"])["per_step"][synthetic.BAD["step"]]
  assert bad.n == 3


def test_a_policy_identical_to_the_floor_sits_at_one(res):
  same = floor.multiples(res, "same_as_floor")
  assert same["overall"].median == pytest.approx(1.0)
  assert (same["overall"].lo, same["overall"].hi) == pytest.approx((1.0, 1.0))
  assert all(st.mean == pytest.approx(1.0) for st in same["per_step"].values())
  assert same["within"] and same["steps_within"] == list(STEPS)
  assert "within 3x the floor: cannot tell from the checkpoint's own sensitivity" in (
      same["sentence"])
  far = floor.multiples(res, "ten_times_floor")
  assert far["overall"].median == pytest.approx(10 * scipy_stats.gmean(synthetic.NOISE))
  assert not far["within"] and "above 3x the floor" in far["sentence"]
  assert "cannot tell" not in far["sentence"]
  # a multiple above 3x whose interval reaches below it cannot tell either
  wide = floor.within(stats.Summary(3.4, 2.9, 4.0, 4, 16, True))
  assert wide and not floor.within(stats.Summary(3.4, 3.1, 4.0, 4, 16, True))
  assert not floor.multiples(results.load(build(res.folder.parent / "old",
                                                steps=(0,))), "attn_l0_e4m3")["available"]


def test_control_verdicts_both_ways_and_cannot_tell(res):
  less = floor.control(res, "attn_l0_e4m3")
  assert less["verdict"] == "less than noise" and less["overall"].hi < 1
  assert "perturbs the gradient less than random noise of the same size" in less["sentence"]
  for st in less["per_step"].values():
    assert (st.mean, st.lo, st.hi) == pytest.approx(_log_t([1 / f for f in LESS]), rel=2e-4)
  assert less["overall"].median == pytest.approx(1 / scipy_stats.gmean(LESS))
  more = floor.control(res, "attn_l0_e5m2")
  assert more["verdict"] == "more than noise" and more["overall"].lo > 1
  same = floor.control(res, "moe_l0_e4m3")
  assert same["verdict"] == "cannot tell" and same["overall"].lo < 1 < same["overall"].hi
  assert "cannot tell (the interval contains 1)" in same["sentence"]
  assert not floor.control(res, "moe_l0_e5m2")["available"]
  text = "\n".join(floor.controls_markdown(res))
  assert "| attn_l0_e4m3 | noise(attn_l0_e4m3) |" in text and "| more than noise |" in text


def test_flag_note_says_when_a_flagged_checkpoint_drives_a_result(res):
  """attention / MoE at layer 0 per checkpoint: 6.67, 2, 0.6, 0.18 (the median of the four
  is 1.1); without step 100 it is 0.6, on the other side of 1; without step 300, 2."""
  a = questions.module_answer(res, flagged=[100])
  assert ("Flagged checkpoint 100 drives the result: without it the result changes in 2 of 4 "
          "comparisons (layer 0 E4M3: ratio 1.1 -> 0.6; layer 0 E5M2: ratio 1.1 -> 0.6)"
          ) in a["summary"]
  c = stats.compare(res, "attn_l0_e4m3", "moe_l0_e4m3", steps=[0, 200, 300])
  assert c["ratio"] == pytest.approx(0.6)
  b = questions.module_answer(res, flagged=[300])
  assert ("Flagged checkpoint 300: without it every one of the 4 comparisons keeps its side "
          "and its significance") in b["summary"]
  assert "Flagged" not in questions.module_answer(res)["summary"]
  r = questions.redistribution_answer(res, 3, flagged=[0])
  assert "rests on flagged checkpoint 0" in r["summary"]


def test_report_with_floor_controls_and_telemetry(tmp_path):
  tel = {"tel/saturated_frac": 0.01, "tel/underflow_frac": 0.002, "tel/zero_block_frac": 0.0,
         "tel/kurtosis": 4.5, "tel/scale_log2_p05": -12.0, "tel/scale_log2_p50": -8.0,
         "tel/scale_log2_p95": -3.0, "tel/x/kurtosis": 9.0,
         "tel/oas_raised_frac": 0.25, "tel/four_frac": float("nan")}  # no 4/6 operand
  folder = build(tmp_path / "s", policies=SEED[:4], floor=True, grad_norm={100: 10.0},
                 controls={"attn_l0_e4m3": LESS}, fields={"attn_l0_e5m2": lambda i, j: tel})
  r = results.load(folder)
  text = sweep_report.render(r, questions.answers(r, 3), {})
  for title in ("## Conditioning per checkpoint", "## Against the noise floor",
                "## Against noise-matched controls", "## Summary per policy"):
    assert title in text
  assert "| floor | floor | `floor` |" in text and "control of attn_l0_e4m3" in text
  assert "- attn_l0_e4m3: rel_err / its noise-matched control's = 0.495" in text
  assert "Block-scale telemetry" in text and "| attn_l0_e5m2 | 0.01 [0.01, 0.01] |" in text
  assert "| oas_raised_frac |" in text and "four_frac" not in text  # all NaN: left out
  assert "nan" not in text.lower().replace("n/a", "") and "[-" not in text.replace(
      "[-12", "").replace("[-8", "").replace("[-3", "")  # log2 scales are negative
  assert "Holm" in text  # the method names the correction
  png = figures.noise_floor(r, tmp_path / "fig")
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
  old = results.load(build(tmp_path / "old", policies=SEED[:2], steps=(0, 100)))
  assert old.floor is None and old.controls == {} and old.policies == SEED[:2]
  text = sweep_report.render(old, questions.answers(old, 3), {})
  assert "This sweep has no noise floor" in text
  assert "Not available: this sweep has no noise floor" in text
  assert "noise-matched controls" not in text
  assert figures.noise_floor(old, tmp_path / "fig_old").stat().st_size > 1000
