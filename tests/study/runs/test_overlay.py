"""The training-run comparison report, on fake run folders with known losses and on two real
tiny runs (slow)."""

from __future__ import annotations

import io
import json
import math
import pathlib
import statistics

from absl import flags
import pytest

from fp8jax.study.runs import overlay

MODULES = ("attn_q", "routed_experts")
STEPS = list(range(10, 210, 10))  # 20 logged steps


def ref_loss(step: int) -> float:
  return 5.0 - 0.01 * step


def config(policy: str, **data) -> dict:
  return {"model": "tiny", "model_overrides": {"num_hidden_layers": 4}, "policy": policy,
          "seed": 0, "data": {"source": "embedded", "seq_len": 128, "global_batch": 8,
                              "seed": 0, **data},
          "optim": {"peak_lr": 3e-3}, "train": {"steps": 200, "log_every": 10}}


def row(step: int, loss: float, **extra) -> dict:
  return {"step": step, "loss": loss, "lm_loss": loss, "aux_loss": 0.01,
          "grad_norm": 1.0 + step / 100, "lr": 1e-3, "tokens_per_s": 1e4, "mfu": None,
          "weight_norm/global": 20.0 + step / 50,
          **{f"weight_norm/{m}": 2.0 + i + step / 100 for i, m in enumerate(MODULES)}, **extra}


def fake_run(folder: pathlib.Path, policy: str, losses: dict[int, float], cfg: dict | None = None,
             extra: dict[int, dict] | None = None, tail_text: str = "") -> pathlib.Path:
  folder.mkdir(parents=True)
  (folder / "config.json").write_text(json.dumps(cfg or config(policy)))
  lines = [json.dumps(row(s, v, **(extra or {}).get(s, {}))) for s, v in losses.items()]
  (folder / "metrics.jsonl").write_text("".join(f"{x}\n" for x in lines) + tail_text)
  return folder


def rel(step: int, scale: float) -> float:
  """The known relative error of the fake FP8 runs: scale * (1 + 0.5 sin(step))."""
  return scale * (1 + 0.5 * math.sin(step))


@pytest.fixture
def three_runs(tmp_path):
  """bf16 (reference), a run 0.1% worse (every step) and one 0.5% worse with steps 50 and
  200 missing and extra steps 210, 220."""
  a = fake_run(tmp_path / "a", "bf16", {s: ref_loss(s) for s in STEPS})
  b = fake_run(tmp_path / "b", "moe@all:e4m3",
               {s: ref_loss(s) * (1 + rel(s, 1e-3)) for s in STEPS})
  c_steps = [s for s in STEPS if s not in (50, 200)] + [210, 220]
  c = fake_run(tmp_path / "c", "attn@all:e5m2",
               {s: ref_loss(s) * (1 + rel(s, 5e-3)) for s in c_steps})
  return a, b, c


def ci95(values: list[float], t: float) -> tuple[float, float, float]:
  m = statistics.fmean(values)
  h = t * statistics.stdev(values) / math.sqrt(len(values))
  return m, m - h, m + h


def test_relative_error_and_tail_mean(three_runs):
  res = overlay.compare(three_runs)
  assert res["reference"] == "bf16"
  common = [s for s in STEPS if s not in (50, 200)]
  assert res["steps"] == common and len(common) == 18
  assert res["tail_steps"] == common[-2:]  # ceil(10% of 18) = 2
  b = res["runs"]["moe@all:e4m3"]
  expect = [(ref_loss(s) * (1 + rel(s, 1e-3)) - ref_loss(s)) / ref_loss(s) for s in common]
  assert b["rel_err"] == pytest.approx(expect, rel=1e-9)
  st = b["final_rel_err"]
  assert st.n == 2
  assert (st.mean, st.lo, st.hi) == pytest.approx(ci95(expect[-2:], 12.706), rel=1e-9)
  assert b["final_loss"] == pytest.approx(ref_loss(190) * (1 + rel(190, 1e-3)))
  assert b["last_step"] == 200 and res["runs"]["attn@all:e5m2"]["last_step"] == 220
  assert res["runs"]["bf16"]["final_rel_err"].mean == 0.0
  wide = overlay.compare(three_runs, tail=0.25)["runs"]["attn@all:e5m2"]["final_rel_err"]
  expect_c = [rel(s, 5e-3) for s in common[-5:]]  # ceil(4.5) = 5 steps, t(4) = 2.776
  assert (wide.mean, wide.lo, wide.hi) == pytest.approx(ci95(expect_c, 2.776), rel=1e-6)
  one = overlay.compare(three_runs, tail=0.01)["runs"]["attn@all:e5m2"]["final_rel_err"]
  assert one.n == 1 and not one.has_ci and one.mean == pytest.approx(rel(190, 5e-3), rel=1e-6)


def test_other_reference_and_bad_arguments(three_runs):
  res = overlay.compare(three_runs, reference=1)
  s = res["steps"][-1]
  expect = (ref_loss(s) - ref_loss(s) * (1 + rel(s, 1e-3))) / (ref_loss(s) * (1 + rel(s, 1e-3)))
  assert res["runs"]["bf16"]["rel_err"][-1] == pytest.approx(expect, rel=1e-9)
  with pytest.raises(ValueError, match="reference must index"):
    overlay.compare(three_runs, reference=3)
  with pytest.raises(ValueError, match="tail must be"):
    overlay.compare(three_runs, tail=0)
  with pytest.raises(ValueError, match="at least two runs"):
    overlay.compare(three_runs[:1])


def test_refuses_runs_of_other_data_or_model(tmp_path):
  losses = {s: ref_loss(s) for s in STEPS}
  a = fake_run(tmp_path / "a", "bf16", losses)
  b = fake_run(tmp_path / "b", "fp8", losses, cfg=config("fp8", seq_len=256))
  with pytest.raises(ValueError, match=r"differ in data\.seq_len .*allow_mismatch"):
    overlay.compare([a, b])
  cfg = config("fp8")
  cfg["model_overrides"]["num_hidden_layers"] = 2
  c = fake_run(tmp_path / "c", "fp8", losses, cfg=cfg)
  with pytest.raises(ValueError, match=r"model_overrides\.num_hidden_layers"):
    overlay.compare([a, c])
  res = overlay.compare([a, b], allow_mismatch=True)
  assert list(res["mismatch"]) == ["data.seq_len"]
  text = overlay.write_report([a, b], tmp_path / "out", allow_mismatch=True).read_text()
  assert "differ in `data.seq_len`" in text


def test_corrupt_line_is_named_and_torn_last_line_skipped(tmp_path):
  run = fake_run(tmp_path / "a", "bf16", {s: ref_loss(s) for s in STEPS[:4]})
  path = run / "metrics.jsonl"
  lines = path.read_text().splitlines()
  path.write_text("\n".join([*lines[:2], '{"step": 30, "loss": 4.', *lines[3:]]) + "\n")
  with pytest.raises(ValueError, match=rf"{path}:3: corrupt metrics line"):
    overlay.load_run(run)
  path.write_text(path.read_text().rstrip("\n"))  # only a last line may be torn
  with pytest.raises(ValueError, match=rf"{path}:3: corrupt metrics line"):
    overlay.load_run(run)
  path.write_text("\n".join(lines) + '\n{"step": 50, "lo')  # killed mid-write
  loaded = overlay.load_run(run)
  assert loaded.steps == STEPS[:4] and "torn last line 5" in loaded.notes[0]
  path.write_text("\n".join([*lines, '{"loss": 1.0}']) + "\n")
  with pytest.raises(ValueError, match=rf"{path}:5: .*integer 'step'"):
    overlay.load_run(run)


def test_resumed_log_keeps_the_last_rows(tmp_path):
  run = fake_run(tmp_path / "a", "bf16", {1: 5.0, 2: 4.9, 3: 4.8, 4: 4.7, 5: 4.6, 6: 4.5})
  with (run / "metrics.jsonl").open("a") as f:  # resumed from step 2, logged 3 and 4 again
    f.write(json.dumps(row(3, 4.81)) + "\n" + json.dumps(row(4, 4.71)) + "\n")
  loaded = overlay.load_run(run)
  assert loaded.steps == [1, 2, 3, 4]
  assert [r["loss"] for r in loaded.rows] == [5.0, 4.9, 4.81, 4.71]
  assert "dropped 4 rows" in loaded.notes[0]


def test_not_a_run_folder(tmp_path):
  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "config.json").write_text(json.dumps(config("bf16")))
  with pytest.raises(FileNotFoundError, match=r"empty is not a training run's folder \(no "
                     r"metrics\.jsonl"):
    overlay.load_run(tmp_path / "empty")
  with pytest.raises(FileNotFoundError, match="no config.json or metrics.jsonl"):
    overlay.load_run(tmp_path / "nothing")


def test_nonfinite_losses_are_reported_not_averaged(tmp_path):
  a = fake_run(tmp_path / "a", "bf16", {s: ref_loss(s) for s in STEPS})
  losses = {s: ref_loss(s) * 1.001 for s in STEPS}
  losses[40], losses[200] = math.nan, math.inf
  b = fake_run(tmp_path / "b", "fp8", losses)
  res = overlay.compare([a, b])
  assert res["nonfinite"] == [(40, "fp8"), (200, "fp8")]
  st = res["runs"]["fp8"]["final_rel_err"]
  assert st.n == 1 and st.n_nonfinite == 1  # tail steps 190, 200; 200 is inf
  assert st.mean == pytest.approx(0.001, rel=1e-9)
  assert math.isnan(res["runs"]["fp8"]["rel_err"][3])
  text = overlay.write_report([a, b], tmp_path / "out").read_text()
  section = text.split("## Non-finite losses", 1)[1].split("##", 1)[0]
  assert "| 40 | fp8 |" in section and "| 200 | fp8 |" in section
  assert "| fp8 | `fp8` | 200 | non-finite |" in text
  runs = text.split("## Runs", 1)[1].split("##", 1)[0]  # which mode each run ran in
  assert "| mode |" in runs and "| default |" in runs and "cannot be told" in runs


def table_row(text: str, name: str) -> list[str]:
  line = next(x for x in text.splitlines() if x.startswith(f"| {name} |"))
  return [c.strip() for c in line.strip("|").split("|")]


def test_report_table_and_figures(three_runs, tmp_path):
  a, b, c = three_runs
  d = fake_run(tmp_path / "d", "fp16", {s: ref_loss(s) * (1 + 2e-3) for s in STEPS},
               extra={s: {"loss_scale": 2.0 ** (15 - s // 100), "skipped_steps": s // 100}
                      for s in STEPS})
  out = tmp_path / "out"
  path = overlay.write_report([a, b, c, d], out)
  text = path.read_text()
  assert path == out / "report.md"
  mean_b = statistics.fmean(rel(s, 1e-3) for s in (180, 190))
  cells = table_row(text, "moe@all:e4m3")
  assert cells[1:4] == ["`moe@all:e4m3`", "200", f"{ref_loss(190) * (1 + rel(190, 1e-3)):.4f}"]
  assert cells[4].startswith(f"+{100 * mean_b:.3g}% [")
  assert cells[5].startswith("yes") and cells[6] == "-"
  assert table_row(text, "attn@all:e5m2")[5] == "no"  # 0.5% > 0.25%
  assert table_row(text, "fp16")[4:] == ["+0.2% [+0.2%, +0.2%] (n=2)", "yes", "2"]
  assert table_row(text, "bf16")[4] == "reference"
  assert "last 10% of the common logged steps, at least one step: 2 step(s), 180 to 190" in text
  names = ("loss", "rel_loss_error", "grad_norm", "weight_norm", "module_weight_norms",
           "loss_scale")
  for name in names:
    png = out / f"{name}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert f"![{name}]({name}.png)" in text


def test_same_policy_twice_gets_folder_names(tmp_path):
  a = fake_run(tmp_path / "seed0", "bf16", {s: ref_loss(s) for s in STEPS})
  cfg = config("bf16")
  cfg["seed"] = 1
  b = fake_run(tmp_path / "seed1", "bf16", {s: ref_loss(s) * 0.999 for s in STEPS}, cfg=cfg)
  res = overlay.compare([a, b])
  assert res["names"] == ["bf16 [seed0]", "bf16 [seed1]"]
  assert res["runs"]["bf16 [seed1]"]["final_rel_err"].mean == pytest.approx(-1e-3, rel=1e-9)


def run_main(*args: str) -> int:
  from fp8jax.experiments import compare_runs  # pylint: disable=import-outside-toplevel
  flags.FLAGS(["compare_runs", *args])
  try:
    return compare_runs.main([])
  finally:
    flags.FLAGS.unparse_flags()


def test_binary_bad_input_exits_2(three_runs, tmp_path, capsys):
  a, b, _ = three_runs
  assert run_main(f"--runs={a},{tmp_path / 'none'}", f"--out={tmp_path / 'o'}") == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and "none is not a training run's folder" in err
  assert run_main(f"--runs={a},{b}", f"--out={tmp_path / 'o'}", "--reference=5") == 2
  assert "reference must index" in capsys.readouterr().err
  assert not (tmp_path / "o" / "report.md").exists()


@pytest.mark.slow
def test_two_real_tiny_runs(tmp_path, capsys):
  from fp8jax.experiments.configs import train_tiny  # pylint: disable=import-outside-toplevel
  from fp8jax.train import loop, metrics_log  # pylint: disable=import-outside-toplevel

  losses = {}
  for policy, name in (("bf16", "bf16"), ("moe@all:e4m3", "fp8")):
    c = train_tiny.get_config()
    c.policy = policy
    c.model_overrides.num_hidden_layers = 1
    c.data.seq_len, c.data.global_batch = 32, 4
    c.optim.warmup_steps = 1
    c.train.steps, c.train.save_every, c.train.log_every = 4, 4, 1
    loop.train(c, tmp_path / name, stream=io.StringIO())
    rows = metrics_log.read_rows(tmp_path / name / "metrics.jsonl")
    losses[name] = {r["step"]: r["loss"] for r in rows}
  assert list(losses["fp8"]) == [1, 2, 3, 4]
  out = tmp_path / "cmp"
  assert run_main(f"--runs={tmp_path / 'bf16'},{tmp_path / 'fp8'}", f"--out={out}",
                  "--tail=0.5") == 0
  assert str(out / "report.md") in capsys.readouterr().out
  errs = [(losses["fp8"][s] - losses["bf16"][s]) / losses["bf16"][s] for s in (3, 4)]
  mean, lo, hi = ci95(errs, 12.706)
  assert 0 < abs(mean) < 0.01  # e4m3 MoE GEMMs perturb the loss, a little
  res = overlay.compare([tmp_path / "bf16", tmp_path / "fp8"], tail=0.5)
  st = res["runs"]["moe@all:e4m3"]["final_rel_err"]
  assert (st.mean, st.lo, st.hi) == pytest.approx((mean, lo, hi), rel=1e-6)
  cells = table_row((out / "report.md").read_text(), "moe@all:e4m3")
  assert cells[2:4] == ["4", f"{losses['fp8'][4]:.4f}"]
  assert cells[4].startswith(f"{100 * mean:+.3g}% [")
  assert (out / "module_weight_norms.png").exists()


def test_lm_loss_metric_compares_the_lm_loss_alone(tmp_path):
  steps = [10, 20, 30, 40]
  a = fake_run(tmp_path / "a", "bf16", {s: 3.0 for s in steps},
               extra={s: {"lm_loss": 2.0} for s in steps})
  b = fake_run(tmp_path / "b", "gemm:fp32_blockwise", {s: 3.3 for s in steps},
               extra={s: {"lm_loss": 1.9} for s in steps})
  lm = overlay.compare([a, b], metric="lm_loss")["runs"]["gemm:fp32_blockwise"]
  total = overlay.compare([a, b])["runs"]["gemm:fp32_blockwise"]
  assert lm["final_rel_err"].mean == pytest.approx(-0.05) and lm["final_loss"] == 1.9
  assert total["final_rel_err"].mean == pytest.approx(0.1) and total["final_loss"] == 3.3
  with pytest.raises(ValueError, match="metric must be one of"):
    overlay.compare([a, b], metric="aux_loss")
  text = overlay.write_report([a, b], tmp_path / "out", metric="lm_loss").read_text()
  assert "the LM loss alone" in text and "| 1.9000 | -5% (n=1) | no |" in text
