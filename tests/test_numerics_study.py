"""The numerics study binary at smoke size: files, and the facts its report states."""

import json

import numpy as np

from fp8jax.study import numerics_report, numerics_study


def test_numerics_study_quick(tmp_path):
  results = numerics_report.run(tmp_path, numerics_study.StudySizes.quick())
  names = {p.name for p in tmp_path.iterdir()}
  assert {"numerics.json", "report.md", "accumulation_error.png", "quantization_snr.png",
          "double_quant.png", "delayed_vs_current.png"} <= names
  assert json.loads((tmp_path / "numerics.json").read_text())["sizes"]["ks"] == [256, 1024, 4096]
  report = (tmp_path / "report.md").read_text()
  assert "Which protocol gives the DeepSeek-V3 figure" in report

  acc = results["accumulation"]
  def norm(dist, name, k):
    return next(r["norm_rel"] for r in acc
                if (r["distribution"], r["accumulator"], r["k"]) == (dist, name, k))
  # Promotion bounds the error; without it, same-sign data errs far more than zero-mean.
  assert norm("positive", "tc, no promotion", 4096) > 10 * norm("positive",
                                                                "tc, promote every 128", 4096)
  assert norm("positive", "tc, no promotion", 4096) > 10 * norm("gaussian",
                                                                "tc, no promotion", 4096)
  assert norm("gaussian", "fp32", 4096) < 1e-6
  # Finer granularity never loses to per-tensor once outliers exceed the E4M3 range.
  snr = {(r["format"], r["outlier_ratio"], r["granularity"]): r["bulk_snr_db"]
         for r in results["quantization_snr"]}
  assert snr[("e4m3", 1e5, "1x128")] > snr[("e4m3", 1e5, "per-tensor")] + 3
  # Power-of-two scales make the transposes (nearly) lossless; FP32 scales do not.
  dq = {(r["scale_format"], r["policy"]): r for r in results["double_quant"]}
  assert dq[("pow2", "scaling_aware")]["changed_vs_requant"] < 0.01
  assert dq[("fp32", "double")]["snr_db"] < dq[("fp32", "requant")]["snr_db"] - 1
  # The range jump saturates under delayed scaling only.
  jump = [r for r in results["delayed"] if r["step"] == 3]
  assert {r["scaling"]: r["saturated"] > 0 for r in jump} == {"delayed": True, "current": False}
  assert results["seed_delayed_example"]["delayed_saturated"] == 1
  verdict = numerics_report.deepseek_verdict(results)
  assert verdict["bits_for_2pct"] in (13, 15) and np.isfinite(verdict["positive_norm"])
