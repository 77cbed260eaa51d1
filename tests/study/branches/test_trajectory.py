"""Does the one-step perturbation predict the trajectory? On synthetic sweep and branch folders
whose predictor -> outcome relation is known."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp8jax.study import sweep_report
from fp8jax.study.branches import trajectory
from fp8jax.study.common import correlation, results
from tests.study.test_sweep_report import BAD, LAYERS, SEED, STEPS, build, floor_rel_err, rel_err

REPO = pathlib.Path(__file__).resolve().parents[3]
K = 8
N_BOOT = 300


def np_spearman(x, y) -> float:
  """Spearman rho by pairwise counting: rank = 1 + #less + (#equal - 1) / 2."""
  x, y = np.asarray(x, float), np.asarray(y, float)

  def ranks(v):
    return 1 + (v[None, :] < v[:, None]).sum(1) + ((v[None, :] == v[:, None]).sum(1) - 1) / 2

  return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def want_rel_err(step: int, policy: str) -> float:
  """The sweep's mean rel_err over the finite batches, from the generating formula."""
  i = STEPS.index(step)
  js = [j for j in range(4) if not (step == BAD["step"] and policy == BAD["policy"] and j == 2)]
  return float(np.mean([rel_err(policy, i, j, False) for j in js]))


def line(s: int, branch: str, kind: str, div: float, gap: float, cos: float = 0.99,
         routing: float = 0.1, bad_steps=()) -> dict:
  """A branch line: param_div grows linearly to ``div`` at K, the relative loss gap is
  ``gap * (0.5 + t / K)``; steps in ``bad_steps`` are non-finite (null entries)."""
  steps = list(range(1, K + 1))
  finite = [t not in bad_steps for t in steps]

  def ser(values):
    return [v if f else None for v, f in zip(values, finite)]

  gaps = [gap * (0.5 + t / K) for t in steps]
  return {"from_step": s, "branch": branch, "kind": kind, "expr": branch, "steps": steps,
          "loss": ser([3.0 * (1 + g) for g in gaps]), "loss_gap": ser([3.0 * g for g in gaps]),
          "loss_rel_gap": ser(gaps), "param_div": ser([div * t / K for t in steps]),
          "param_div_by_module": {}, "param_div_by_layer": {},
          "update_cos": ser([cos + 0.001 * (t % 2) for t in steps]),
          "routing_diff": ser([routing * t / K for t in steps]), "growth_rate": 0.05,
          "finite": finite,
          "nonfinite": f"step {bad_steps[0]}: grads/lm_head" if bad_steps else None}


def write_branches(folder: pathlib.Path, lines: list[dict]) -> pathlib.Path:
  folder.mkdir(parents=True, exist_ok=True)
  meta = {"train_workdir": "/runs/synthetic", "k": K,
          "policies": {p: {"expr": p} for p in SEED},
          "from_steps": sorted({x["from_step"] for x in lines}), "noise": {"scale": 1.0}}
  (folder / "meta.json").write_text(json.dumps(meta))
  (folder / "branches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
  return folder


def grid_lines(outcome, noise_div: float = 1e-6, noise_gap: float = 1e-7, bad=()) -> list:
  """Reference, two noise branches and every seed policy at every checkpoint; policy
  outcomes ``outcome(step, policy) -> (div, gap)``; ``bad``: {(step, policy): bad_steps}."""
  out = []
  for s in STEPS:
    out += [line(s, "bf16", "reference", 0.0, 0.0, cos=1.0, routing=0.0),
            line(s, "noise", "noise", noise_div, noise_gap),
            line(s, "noise_1", "noise", noise_div / 2, -2 * noise_gap, cos=0.995)]
    for p in SEED:
      div, gap = outcome(s, p)
      out.append(line(s, p, "policy", div, gap, bad_steps=dict(bad).get((s, p), ())))
  return out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  return build(tmp_path_factory.mktemp("traj") / "compare")


@pytest.fixture(scope="module")
def res(sweep):
  return results.load(sweep)


def monotone(s, p):
  r = want_rel_err(s, p)
  return 10 * r ** 1.5, 0.5 * r


def test_load_branches_dedup_torn_and_errors(tmp_path):
  lines = [line(0, "bf16", "reference", 0, 0), line(0, "moe_l0_e4m3", "policy", 1.0, 0.1),
           line(0, "noise", "noise", 0.1, 0.01), line(0, "moe_l0_e4m3", "policy", 2.0, 0.2)]
  folder = write_branches(tmp_path / "b", lines)
  with open(folder / "branches.jsonl", "a") as f:
    f.write('{"from_step": 0, "bra')  # a killed writer's torn last line
  br = trajectory.load_branches(folder)
  assert [(x["kind"], x["branch"]) for x in br.lines] == [
      ("reference", "bf16"), ("noise", "noise"), ("policy", "moe_l0_e4m3")]
  assert br.of_kind("policy")[0]["param_div"][-1] == 2.0  # the later duplicate wins
  assert br.k == K and br.from_steps == [0]
  text = (folder / "branches.jsonl").read_text().splitlines()
  (folder / "branches.jsonl").write_text("\n".join([text[0], text[1], "{corrupt", *text[2:]]))
  with pytest.raises(ValueError, match=r"branches\.jsonl:3: not a JSON object"):
    trajectory.load_branches(folder)
  short = {**lines[1], "param_div": [1.0]}
  (folder / "branches.jsonl").write_text(json.dumps(lines[0]) + "\n" + json.dumps(short) + "\n"
                                         + json.dumps(lines[2]) + "\n")
  with pytest.raises(ValueError, match=r"branches\.jsonl:2: param_div has 1 entries"):
    trajectory.load_branches(folder)
  (folder / "branches.jsonl").unlink()
  with pytest.raises(FileNotFoundError, match="branches.jsonl"):
    trajectory.load_branches(folder)
  with pytest.raises(FileNotFoundError, match="meta.json"):
    trajectory.load_branches(tmp_path / "nowhere")


def test_outcomes_and_noise_floor_by_hand():
  x = line(100, "p", "policy", 0.4, 0.02, cos=0.9, routing=0.3)
  o = trajectory.outcome(x)
  assert trajectory.tail_len(K) == 2 and trajectory.tail_len(3) == 1
  assert o["param_div"] == pytest.approx(0.4) and o["routing_div"] == pytest.approx(0.3)
  assert o["loss_gap"] == pytest.approx(0.02 * (1.375 + 1.5) / 2)
  assert o["update_cos"] == pytest.approx(0.9 + 0.001 * 4 / 8)
  assert trajectory.outcome(x, tail=8)["loss_gap"] == pytest.approx(
      np.mean([0.02 * (0.5 + t / 8) for t in range(1, 9)]))
  assert o["growth_rate"] == 0.05 and o["n_nonfinite"] == 0
  noise = {(100, "noise"): {**trajectory.outcome(line(100, "noise", "noise", 0.1, 0.01)),
                            "kind": "noise"},
           (100, "noise_1"): {**trajectory.outcome(line(100, "n1", "noise", 0.3, -0.02,
                                                         cos=0.95)), "kind": "noise"},
           (100, "p"): {**o, "kind": "policy"}}
  f = trajectory.noise_floor(noise)[100]
  assert f["n_noise"] == 2 and f["param_div"] == pytest.approx(0.3)
  assert f["loss_gap"] == pytest.approx(0.02 * 1.4375)  # max |gap| tail mean
  assert f["update_cos"] == pytest.approx(0.95 + 0.0005)  # the lowest cosine
  assert trajectory.above_floor("param_div", 0.4, f["param_div"])
  assert not trajectory.above_floor("loss_gap", -0.02, f["loss_gap"])
  assert trajectory.above_floor("loss_gap", -0.03, f["loss_gap"])
  assert trajectory.above_floor("update_cos", 0.9, f["update_cos"])
  assert trajectory.above_floor("growth_rate", 1.0, 0.0) is None
  assert trajectory.above_floor("param_div", math.nan, 0.1) is None


def test_predictors_match_the_sweep_and_skip_nonfinite(res):
  preds, skipped = trajectory.predictors(res)
  assert skipped == 1  # the sweep's one non-finite row
  for s in STEPS:
    i = STEPS.index(s)
    for p in SEED:
      got = preds[(s, p)]
      assert got["rel_err"] == pytest.approx(want_rel_err(s, p)), (s, p)
      assert got["share_direct"] == pytest.approx(0.8 - 0.2 * i)
      moe = p.startswith("moe")
      want = np.mean([0.01 * lay * (1 + i) for lay in range(1, LAYERS)]) if moe else 0.005
      assert got["routing"] == pytest.approx(want)


def test_monotone_relation_gives_rho_one(res, tmp_path):
  br = trajectory.load_branches(write_branches(tmp_path / "b", grid_lines(monotone)))
  st = trajectory.study(res, br, n_boot=N_BOOT)
  assert len(st["pairs"]) == len(SEED) * len(STEPS) and not st["unmatched"]
  c = st["correlations"][("rel_err", "param_div")]
  xs = [want_rel_err(p["step"], p["policy"]) for p in st["pairs"]]
  assert np_spearman(xs, [p["outcome"]["param_div"] for p in st["pairs"]]) == pytest.approx(1)
  assert (c["rho"], c["lo"], c["hi"], c["within"]) == pytest.approx((1, 1, 1, 1))
  assert (c["n"], c["n_excluded"], c["n_groups"]) == (32, 0, 4)
  assert st["correlations"][("rel_err", "loss_gap")]["rho"] == pytest.approx(1)
  v = st["verdicts"][("rel_err", "param_div")]
  assert "rho = 1 (95% CI [1, 1], n = 32)" in v and "A positive relation" in v
  assert "Above the noise floor in 32 of 32 policy branches (100%)" in v
  # routing and update cosines of the synthetic policy branches equal the noise branches'
  assert st["summary"].endswith("not distinguishable from the noise floor: routing_div, "
                                "update_cos.")
  # share_direct is the same for every policy at a checkpoint: no within-checkpoint rho
  assert st["correlations"][("share_direct", "param_div")]["n_groups"] == 0
  g = st["correlations"][("rel_err", "growth_rate")]  # growth_rate is 0.05 everywhere
  assert g["reason"] == "constant outcome" and math.isnan(g["rho"])
  assert "not enough data (constant outcome; n = 32)" in st["verdicts"][("rel_err",
                                                                         "growth_rate")]


def test_no_relation_ci_contains_rho_and_is_deterministic(res, tmp_path):
  u = np.random.default_rng(7).uniform(0.1, 1.0, (len(STEPS), len(SEED)))
  noise = lambda s, p: (u[STEPS.index(s), SEED.index(p)], 0.01)
  br = trajectory.load_branches(write_branches(tmp_path / "b", grid_lines(noise)))
  st = trajectory.study(res, br, n_boot=N_BOOT)
  c = st["correlations"][("rel_err", "param_div")]
  want = np_spearman([want_rel_err(p["step"], p["policy"]) for p in st["pairs"]],
                     [p["outcome"]["param_div"] for p in st["pairs"]])
  assert abs(want) < 0.3  # the data carry no relation
  assert c["rho"] == pytest.approx(want)
  assert c["lo"] <= c["rho"] <= c["hi"] and c["lo"] < 0 < c["hi"]
  v = st["verdicts"][("rel_err", "param_div")]
  assert f"No evidence of a relation (permutation p = {correlation.fmt_p(c['p'])}" in v
  # The permutation p-value of a null relation is close to SciPy's t approximation.
  want_p = scipy_stats.spearmanr([p["rel_err"] for p in st["pairs"]],
                                 [p["outcome"]["param_div"] for p in st["pairs"]]).pvalue
  assert c["p"] == pytest.approx(want_p, abs=0.05) and c["p_adj"] >= c["p"]
  again = trajectory.study(res, br, n_boot=N_BOOT)["correlations"][("rel_err", "param_div")]
  assert again == c
  x = [p["rel_err"] for p in st["pairs"]]
  y = [p["outcome"]["param_div"] for p in st["pairs"]]
  other = trajectory.correlate(x, y, n_boot=N_BOOT, seed=1)
  assert other["rho"] == c["rho"] and (other["lo"], other["hi"]) != (c["lo"], c["hi"])


def test_not_enough_data():
  c = trajectory.correlate([1.0, 2.0], [3.0, 4.0])
  assert c["reason"] == "2 pairs, fewer than 3" and math.isnan(c["rho"])
  c = trajectory.correlate([1.0, 2.0, math.nan, 4.0], [1.0, 1.0, 2.0, 1.0])
  assert c["reason"] == "constant outcome" and (c["n"], c["n_excluded"]) == (3, 1)
  assert "not enough data" in trajectory.verdict("rel_err", "param_div", c, None)


def test_outcomes_within_the_noise_floor(res, tmp_path):
  lines = grid_lines(monotone, noise_div=100.0, noise_gap=10.0)
  br = trajectory.load_branches(write_branches(tmp_path / "b", lines))
  st = trajectory.study(res, br, n_boot=N_BOOT)
  for k in ("param_div", "loss_gap"):
    v = st["verdicts"][("rel_err", k)]
    assert (f"The {k} is not distinguishable from the noise floor: above it in 0 of 32 "
            "policy branches (0%)") in v
  assert "not distinguishable from the noise floor: param_div, loss_gap" in st["summary"]
  half = {"above": 5, "n": 10}
  c = st["correlations"][("rel_err", "param_div")]
  assert "not distinguishable" in trajectory.verdict("rel_err", "param_div", c, half)
  assert "Above the noise floor in 6 of 10" in trajectory.verdict(
      "rel_err", "param_div", c, {"above": 6, "n": 10})


def test_nonfinite_branch_steps_are_excluded_and_counted(res, tmp_path):
  bad = {(200, "attn_l0_e4m3"): (3,), (300, "moe_l0_e5m2"): (K,)}
  br = trajectory.load_branches(write_branches(tmp_path / "b", grid_lines(monotone, bad=bad)))
  outs = trajectory.outcomes(br)
  mid = outs[(200, "attn_l0_e4m3")]
  cos = [0.99 + 0.001 * (t % 2) for t in range(1, K + 1) if t != 3]
  assert mid["n_nonfinite"] == 1 and mid["update_cos"] == pytest.approx(np.mean(cos))
  assert mid["param_div"] == pytest.approx(monotone(200, "attn_l0_e4m3")[0])
  end = outs[(300, "moe_l0_e5m2")]
  assert math.isnan(end["param_div"]) and math.isnan(end["routing_div"])
  assert end["loss_gap"] == pytest.approx(0.5 * want_rel_err(300, "moe_l0_e5m2") * 1.375)
  st = trajectory.study(res, br, n_boot=N_BOOT)
  c = st["correlations"][("rel_err", "param_div")]
  assert (c["n"], c["n_excluded"], c["rho"]) == (31, 1, pytest.approx(1))
  assert "n = 31, 1 excluded as non-finite or undefined" in st["verdicts"][("rel_err",
                                                                            "param_div")]
  assert st["correlations"][("rel_err", "loss_gap")]["n"] == 32
  assert sorted((s, b, n) for s, b, n, _ in st["nonfinite"]) == [
      (200, "attn_l0_e4m3", 1), (300, "moe_l0_e5m2", 1)]
  text = "\n".join(trajectory.markdown(st, br, res))
  assert "| 300 | moe_l0_e5m2 | 1 | step 8: grads/lm_head |" in text


def _is_png(path: pathlib.Path) -> bool:
  return path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_report_section_only_with_branch_data(sweep, tmp_path):
  title = f"## {trajectory.TITLE}"
  plain = sweep_report.write_report(sweep, out=tmp_path / "plain", top_k=3)
  assert title not in plain.read_text()
  assert not (tmp_path / "plain" / "figures" / "trajectory.png").exists()
  branch = write_branches(tmp_path / "b", grid_lines(monotone))
  path = sweep_report.write_report(sweep, out=tmp_path / "out", top_k=3, branch=branch,
                                   n_boot=N_BOOT)
  text = path.read_text()
  assert title in text and "![trajectory](figures/trajectory.png)" in text
  assert _is_png(tmp_path / "out" / "figures" / "trajectory.png")
  assert "- rel_err vs param_div: Spearman rho = 1 (95% CI [1, 1], n = 32)" in text
  c = trajectory.study(results.load(sweep), trajectory.load_branches(branch),
                       n_boot=N_BOOT)["correlations"][("rel_err", "param_div")]
  assert c["p"] == pytest.approx(1 / (correlation.N_PERM + 1))  # no pairing beats rho = 1
  row = (f"| rel_err | param_div | 32 | 0 | 1 | [1, 1] | {correlation.fmt_p(c['p'])} | "
         f"{correlation.fmt_p(c['p_adj'])} | 1 (4) |")
  assert row in text
  assert "| 0 | 2 | 1e-06 | 8 of 8 |" in text  # noise floor of checkpoint 0
  # The rest of the report is unchanged by the section.
  assert text.split(title)[0] == plain.read_text().split("## Figures")[0]


@pytest.mark.slow
def test_branch_folder_is_found_next_to_the_sweep(tmp_path):
  sweep = build(tmp_path / "run" / "compare", policies=("moe_l0_e4m3", "moe_l0_e5m2"),
                steps=(0, 100))
  assert sweep_report.branch_folder(sweep) is None
  title = f"## {trajectory.TITLE}"
  assert title not in sweep_report.write_report(sweep).read_text()
  lines = [line(s, p, "policy", 0.1 * (1 + i), 0.01) for i, s in enumerate((0, 100))
           for p in ("moe_l0_e4m3", "moe_l0_e5m2")]
  write_branches(tmp_path / "run" / "branch", lines)
  assert sweep_report.branch_folder(sweep) == (tmp_path / "run" / "branch").resolve()
  text = sweep_report.write_report(sweep, n_boot=50).read_text()
  assert title in text and "not enough data" in text and "nan" not in text.lower()
  assert title not in sweep_report.write_report(sweep, find_branch=False).read_text()


@pytest.mark.slow
def test_binary_branch_flag(sweep, tmp_path):
  branch = write_branches(tmp_path / "b", grid_lines(monotone))
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  out = tmp_path / "bin"
  proc = subprocess.run([sys.executable, "-m", "fp8jax.experiments.report",
                         f"--results={sweep}", f"--out={out}", "--top_k=3",
                         f"--branch={branch}"],
                        capture_output=True, text=True, env=env, cwd=REPO, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"## {trajectory.TITLE}" in (out / "report.md").read_text()


def test_conditioning_floor_and_telemetry_predictors_under_holm(tmp_path):
  """With a floor and telemetry in the sweep, the floor multiple, the checkpoint's
  conditioning and the telemetry fields join the predictors; every verdict is adjusted over
  the whole family."""
  tel = lambda i, j: {"tel/saturated_frac": 0.001 * (1 + i)}  # noqa: E731
  sweep = build(tmp_path / "compare", floor=True, fields={p: tel for p in SEED[:4]},
                grad_norm={100: 10.0}, controls={"attn_l0_e4m3": (2.0, 2.0, 2.0, 2.0)})
  res = results.load(sweep)
  preds, _ = trajectory.predictors(res)
  assert preds[(0, "noise(attn_l0_e4m3)")]["rel_err"] == pytest.approx(
      2 * preds[(0, "attn_l0_e4m3")]["rel_err"])  # a control can be branched off too
  assert (0, "floor") not in preds
  got = preds[(100, "attn_l0_e4m3")]
  assert got["grad_norm"] == pytest.approx(10.0)
  assert got["tel/saturated_frac"] == pytest.approx(0.002)
  assert math.isnan(preds[(100, "moe_l0_e4m3")]["tel/saturated_frac"])  # no GEMM recipe
  want = np.exp(np.mean([np.log(rel_err("attn_l0_e4m3", 1, j, False) / floor_rel_err(1, j))
                         for j in range(4)]))
  assert got["floor_multiple"] == pytest.approx(want)
  br = trajectory.load_branches(write_branches(tmp_path / "b", grid_lines(monotone)))
  st = trajectory.study(res, br, n_boot=N_BOOT)
  assert st["predictors"] == ["rel_err", "share_direct", "routing", "floor_multiple", "loss",
                              "grad_norm", "floor_rel_err", "curvature", "tel/saturated_frac"]
  with_p = [c for c in st["correlations"].values() if math.isfinite(c["p"])]
  assert st["n_tests"] == len(with_p) > 4  # the base predictors alone give 4 tests
  assert [c["p_adj"] for c in with_p] == pytest.approx(
      list(correlation.holm([c["p"] for c in with_p])))
  f = st["correlations"][("floor_multiple", "param_div")]
  assert f["rho"] > 0.9 and correlation.related(f)
  assert "A positive relation (permutation p = " in st["verdicts"][("floor_multiple",
                                                                    "param_div")]
  assert f"Holm-adjusted p < 0.05 over {st['n_tests']} tests" in st["summary"]
  text = "\n".join(trajectory.markdown(st, br, res))
  assert "| tel/saturated_frac | param_div | 16 | 16 |" in text  # 16 policy branches lack it
