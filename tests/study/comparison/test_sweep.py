"""The comparison sweep: end to end on a tiny run, exact zeros, resume after a kill.

``train_run`` (tests/conftest.py) is a tiny run with checkpoints 0, 2, 4.
"""

import io
import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from fp8jax.study import sweep_report
from fp8jax.study.common import results_io
from fp8jax.study.comparison import figures as figs
from fp8jax.study.comparison import sweep
from fp8jax.train import faults

REPO = pathlib.Path(__file__).resolve().parents[3]
WINDOWS = sweep.Windows(offsets=(0, 3), batches=2, batch_size=4)


POLICIES = ["attn_l0_e4m3", "moe_l1-2_e5m2", "bf16", "noise(attn_l0_e4m3)"]


@pytest.mark.slow
def test_sweep_rows_details_and_zero_for_an_empty_policy(train_run, tmp_path):
  out = tmp_path / "cmp"
  summary = sweep.run(train_run, out, policies=POLICIES, windows=WINDOWS)
  names = [*POLICIES, "floor"]
  assert summary["rows_written"] == 3 * 4 * len(names)
  rows = results_io.read(out / "rows.jsonl")
  assert {(r["step"], r["offset"], r["batch"], r["policy"]) for r in rows} == {
      (s, o, b, p) for s in (0, 2, 4) for o in (0, 3) for b in (0, 1) for p in names}
  for r in rows:
    assert r["finite"] and r["nonfinite"] is None
    values = [v for k, v in r.items() if isinstance(v, float)]
    assert np.all(np.isfinite([v for v in values if not np.isnan(v)]))
    if r["policy"] == "bf16":  # no active site: exactly the BF16 gradients
      assert r["diff_norm"] == 0.0 and r["loss_abs_err"] == 0.0
      assert r["cosine"] == pytest.approx(1.0, abs=1e-6)
      assert all(r[f"routing/{i}/topk_set_diff_frac"] == 0.0 for i in (1, 2))
    else:
      assert 0 < r["rel_err"] < 1 and r["loss_rel_err"] < 0.05
  floor = {(r["step"], r["offset"], r["batch"]): r for r in rows if r["policy"] == "floor"}
  for r in floor.values():  # BF16 at weights moved by <= 2^-8 relative: a positive floor
    assert r["perturbation_norm"] > 0 and "share_direct" not in r
    assert r["curvature"] == pytest.approx(r["diff_norm"] / r["perturbation_norm"])
  assert len({r["diff_norm"] for r in floor.values()}) == len(floor)  # a draw per batch
  attn = [r for r in rows if r["policy"] == "attn_l0_e4m3"]
  # Quantizing layer 0's attention output moves gradients upstream of it too.
  assert all(r["module/attn_q/diff_norm"] > 0 for r in attn)
  assert all(0 < r["share_direct"] < 1 for r in attn)
  details = results_io.read(out / "details.jsonl")
  assert len(details) == len(rows)
  assert "layers/0/self_attn/o_proj/kernel" in details[0]["per_param"]
  base = results_io.read(out / "baseline.jsonl")
  assert len(base) == 3 * 4 and all(b["finite"] for b in base)
  weights = results_io.read(out / "weights.jsonl")
  assert [w["step"] for w in weights] == [0, 2, 4]
  meta = json.loads((out / "meta.json").read_text())
  assert meta["steps"] == [0, 2, 4] and set(meta["policies"]) == set(names)
  assert meta["policies"]["floor"]["kind"] == "floor"
  assert meta["reference"]["precision"] == "bf16"  # DeepSeek-MoE's baseline, from the model
  control = meta["policies"]["noise(attn_l0_e4m3)"]
  assert {k: v for k, v in control.items() if k != "record"} == {
      "expr": "noise(attn_out@0:e4m3/tensor)", "kind": "control",
      "control_of": "attn_l0_e4m3", "direct": meta["policies"]["attn_l0_e4m3"]["direct"]}
  assert control["record"]["noise"] and control["record"]["cell"] is None
  assert meta["policies"]["attn_l0_e4m3"]["record"]["cell"] == {
      "module": "attn", "depth": "l0", "format": "e4m3"}
  assert meta["policies"]["moe_l1-2_e5m2"]["record"]["cell"] == {
      "module": "moe", "depth": "l1-2", "format": "e5m2"}
  # The floor is reproducible: another sweep of one checkpoint draws the same perturbations.
  again = tmp_path / "again"
  said = io.StringIO()
  sweep.run(train_run, again, policies=["bf16"], steps=[4], windows=WINDOWS, stream=said)
  compiling = [ln for ln in said.getvalue().splitlines() if "compil" in ln]
  assert compiling[::2] == ["[compare] compiling the BF16 baseline (1/3)...",  # once each
                            "[compare] compiling policy bf16 (2/3)...",
                            "[compare] compiling policy floor (3/3)..."], compiling
  assert all(re.fullmatch(r"\[compare\] compiled .* in \d+\.\d s \(with its first run\)",
                          ln) for ln in compiling[1::2]), compiling
  for r in results_io.read(again / "rows.jsonl"):
    if r["policy"] == "floor":
      assert r == floor[(r["step"], r["offset"], r["batch"])]
  # Same batch, same params: the BF16 loss equals the baseline's and is policy-independent.
  losses = {(r["step"], r["offset"], r["batch"]): r["loss_bf16"] for r in rows}
  assert all(losses[(b["step"], b["offset"], b["batch"])] == b["loss"] for b in base)
  # A rerun skips everything.
  assert sweep.run(train_run, out, policies=POLICIES, windows=WINDOWS)["rows_written"] == 0
  # The report reads the sweep: every figure and the four answers.
  md = pathlib.Path(sweep_report.write_report(out)).read_text()
  figures = sorted((out / "figures").glob("*.png"))
  assert len(figures) == len(figs.NAMES) and all(f.stat().st_size > 1000 for f in figures)
  for policy in POLICIES:
    assert policy in md
  assert "nan" not in md.split("## Question")[0].lower().replace("nan%", "")
  assert "Reference: BF16" in md and "tokens (BF16)" in md and "FP32 reference" not in md


@pytest.mark.slow
def test_resume_after_a_kill_mid_row_gives_the_same_rows(train_run, tmp_path):
  args = [sys.executable, "-m", "fp8jax.experiments.compare", f"--train_workdir={train_run}",
          "--policies=attn_l0_e4m3,moe_l1-2_e4m3,moe_l1-2_e5m2", "--offsets=0,3",
          "--batches=2", "--batch_size=4"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  subprocess.run([*args, f"--out={tmp_path / 'full'}"], env=env, check=True,
                 capture_output=True, timeout=600)
  killed = tmp_path / "killed"
  proc = subprocess.run([*args, f"--out={killed}"], capture_output=True, timeout=600,
                        env={**env, faults.ENV: "append/rows.jsonl@5"})  # mid-line
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
  assert len(results_io.read(killed / "rows.jsonl")) == 4
  assert not (killed / "rows.jsonl").read_text().endswith("\n")  # the torn fifth row
  resumed = subprocess.run([*args, f"--out={killed}"], env=env, capture_output=True,
                           text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  key = lambda r: (r["step"], r["offset"], r["batch"], r["policy"])  # noqa: E731
  full = sorted(results_io.read(tmp_path / "full" / "rows.jsonl"), key=key)
  again = sorted(results_io.read(killed / "rows.jsonl"), key=key)
  assert len(again) == len(full) == 3 * 4 * 4  # the three policies and the floor
  assert json.dumps(again) == json.dumps(full)
  assert len(results_io.read(killed / "details.jsonl")) == len(full)


@pytest.mark.slow
@pytest.mark.parametrize("kwargs, error", [
    (dict(policies=["attn@9:e4m3"]), "names layer 9"),
    (dict(policies=["nonsense"]), "bad policy term"),
    (dict(steps=[3]), "checkpoints \\[3\\] are not in"),
    (dict(delayed_warmup=-1), "delayed_warmup must be >= 0"),
])
def test_bad_input(train_run, tmp_path, kwargs, error):
  with pytest.raises(ValueError, match=error):
    sweep.run(train_run, tmp_path / "cmp", windows=WINDOWS, **{"policies": ["bf16"], **kwargs})
  assert not (tmp_path / "cmp" / "rows.jsonl").exists()


def test_missing_training_run(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    sweep.run(tmp_path / "nothing", tmp_path / "cmp")


@pytest.mark.slow
def test_binaries_report_bad_input_without_a_traceback(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  for args in (["fp8jax.experiments.compare", f"--train_workdir={tmp_path}/none"],
               ["fp8jax.experiments.train", "--config.data.source=hf:c4",
                f"--workdir={tmp_path}/run"]):
    out = subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.startswith("error: "), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_formats_grid_end_to_end(train_run, tmp_path):
  """Two recipes of the formats grid at smoke size, 8 and 4 bits (FP8 blockwise, MXFP4;
  the NVFP4 recipe's gradients are checked in tests/gemm/test_mx_gemm.py and
  tests/quant/test_noise_control.py): every row is finite, the 4-bit recipe perturbs the
  gradients more than the 8-bit one, and the report answers question 5."""
  out = tmp_path / "fmt"
  windows = sweep.Windows(offsets=(0,), batches=1, batch_size=4)
  pols = ["gemm:fp32_blockwise", "gemm:mxfp4"]
  sweep.run(train_run, out, policies=pols, windows=windows, steps=[4])
  rows = results_io.read(out / "rows.jsonl")
  by = {r["policy"]: r for r in rows}
  assert set(by) == {*pols, "floor"}
  assert all(r["finite"] for r in rows)
  assert min(by[p]["rel_err"] for p in pols[1:]) > by[pols[0]]["rel_err"]
  assert min(by[p]["rel_err"] for p in pols) > by["floor"]["rel_err"]
  for p in pols:  # the operands' block-scale telemetry (tests/gemm/test_operand_telemetry.py)
    fracs = [by[p][f"tel/{k}"] for k in ("saturated_frac", "underflow_frac", "zero_block_frac")]
    assert all(0 <= f <= 1 for f in fracs) and by[p]["tel/kurtosis"] > 1
    assert by[p]["tel/scale_log2_p05"] <= by[p]["tel/scale_log2_p50"] <= by[p][
        "tel/scale_log2_p95"]
  assert by["gemm:fp32_blockwise"]["tel/saturated_frac"] == 0  # FP32 scales: amax -> max
  assert by["gemm:mxfp4"]["tel/saturated_frac"] > 0  # the OCP rule clips up to a binade
  assert "tel/kurtosis" not in by["floor"]
  text = sweep_report.write_report(out).read_text()
  section = text.split("## 5. Format width")[1].split("\n## ")[0]
  assert "grows by a factor" in section and "(`mxfp4`) | 4 |" in section
  gemm = json.loads((out / "meta.json").read_text())["policies"]["gemm:mxfp4"]["record"]["gemm"]
  assert (gemm["recipe"], gemm["bits"]) == ("mxfp4", 4)
  assert (out / "figures" / "format_width.png").exists()
