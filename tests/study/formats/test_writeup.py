"""The numerics study binary at smoke size: files, and the facts its report states."""

import json
import math

import numpy as np
import pytest

from fp8jax.study.formats import fp8_sections, mx_sections, writeup

pytestmark = pytest.mark.slow  # the tests share one run of the whole study


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
  """The whole study at smoke size, run once: ``(results, folder)``."""
  out = tmp_path_factory.mktemp("numerics")
  return writeup.run(out, fp8_sections.StudySizes.quick()), out


def test_numerics_study_quick(quick_report):
  results, tmp_path = quick_report
  names = {p.name for p in tmp_path.iterdir()}
  assert {"numerics.json", "report.md", "accumulation_error.png", "quantization_snr.png",
          "double_quant.png", "delayed_vs_current.png", "formats_snr.png",
          "stochastic_rounding.png", "hadamard_wgrad.png"} <= names
  assert json.loads((tmp_path / "numerics.json").read_text())["sizes"]["ks"] == [256, 1024, 4096]
  report = (tmp_path / "report.md").read_text()
  assert "Which protocol gives the DeepSeek-V3 figure" in report
  for title in ("## 5. MX and NVFP4", "## 6. Stochastic rounding", "## 7. The random Hadamard"):
    assert title in report

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
  # The same at a model site: the site's range doubles exactly at step 3 and only delayed
  # scaling (history of steps 0-2) saturates there; the logits suffer for it.
  site = {(r["step"], r["scaling"]): r for r in results["delayed_model_site"]}
  assert site[(3, "current")]["amax"] == 2 * site[(2, "current")]["amax"]
  assert [site[(3, s)]["saturated"] > 0 for s in ("delayed", "current")] == [True, False]
  assert site[(2, "delayed")]["saturated"] == 0
  assert site[(3, "delayed")]["logits_rel_err"] > site[(3, "current")]["logits_rel_err"]
  assert "The same jump at a model site" in report
  verdict = writeup.deepseek_verdict(results)
  assert verdict["bits_for_2pct"] in (13, 15) and np.isfinite(verdict["positive_norm"])


KEYS = {
    "formats_snr": {"format", "spec", "outlier_ratio", "bulk_shared_frac", "snr_db",
                    "bulk_snr_db", "outlier_snr_db", "saturated_frac", "underflow_frac"},
    "sr_bias": {"format", "rounding", "keys", "elements", "in_range_frac",
                "mean_abs_bias_steps", "max_abs_bias_steps", "saturated_mean_abs_bias_steps",
                "hoeffding_steps"},
    "sr_sum": {"distribution", "format", "rounding", "k", "bias", "bias_z", "rms", "rel_rms",
               "in_range_bias", "in_range_bias_z"},
    "hadamard": {"magnitude", "format", "hadamard", "max_rel", "p99_rel", "median_rel",
                 "norm_rel", "max_over_range"},
    "hadamard_exact": {"magnitude", "rel_diff", "f32_gemm_rel_err", "unit_roundoff"},
}


def test_format_sections_rows_have_their_keys_and_no_nan(quick_report):
  results, _ = quick_report
  sizes = fp8_sections.StudySizes.quick()
  counts = {"formats_snr": len(mx_sections.FORMATS) * len(sizes.format_ratios),
            "sr_bias": 2 * len(mx_sections.SR_FORMATS),
            "sr_sum": 2 * len(mx_sections.SR_FORMATS) * len(sizes.sr_ks)
            * len(mx_sections.SUM_DISTRIBUTIONS),
            "hadamard": 4 * len(sizes.rht_magnitudes),
            "hadamard_exact": len(sizes.rht_magnitudes)}
  for table, keys in KEYS.items():
    rows = results[table]
    assert len(rows) == counts[table], table
    for row in rows:
      assert set(row) == keys, (table, row)
      for k, v in row.items():
        assert not (isinstance(v, float) and math.isnan(v)), (table, k, row)


def test_ocp_rule_saturates_where_round_up_does_not(quick_report):
  rows = {(r["format"], r["outlier_ratio"]): r for r in quick_report[0]["formats_snr"]}
  for ratio in fp8_sections.StudySizes.quick().format_ratios:
    for ocp, up in (("mxfp8_ocp", "mxfp8"), ("mxfp4", "mxfp4_rceil")):
      assert rows[(ocp, ratio)]["saturated_frac"] > 0, (ocp, ratio)
      assert rows[(up, ratio)]["saturated_frac"] == 0, (up, ratio)
    for name in ("fp8 per-tensor", "deepseek-v3 1x128", "nvfp4"):
      assert rows[(name, ratio)]["saturated_frac"] == 0, (name, ratio)
  hi = max(fp8_sections.StudySizes.quick().format_ratios)
  # Clipped outliers cost overall SNR once they dominate; the ordinary channels keep it.
  assert rows[("mxfp8_ocp", hi)]["snr_db"] < rows[("mxfp8", hi)]["snr_db"] - 2
  assert rows[("mxfp8_ocp", hi)]["bulk_snr_db"] > 28
  # FP4 loses the ordinary values sharing a block with an outlier; NVFP4's smaller blocks
  # share fewer, and its E4M3 block scales keep the outliers themselves more accurate.
  for name in ("mxfp4", "nvfp4"):
    r = rows[(name, hi)]
    assert r["bulk_snr_db"] < -10 * math.log10(r["bulk_shared_frac"]) + 3, name
  assert rows[("nvfp4", hi)]["bulk_shared_frac"] < rows[("mxfp4", hi)]["bulk_shared_frac"]
  assert rows[("nvfp4", hi)]["outlier_snr_db"] > rows[("mxfp4", hi)]["outlier_snr_db"] + 6


def test_stochastic_rounding_is_unbiased_and_round_to_nearest_is_not(quick_report):
  results = quick_report[0]
  for r in results["sr_bias"]:
    if r["rounding"] == "stochastic":
      assert r["max_abs_bias_steps"] <= r["hoeffding_steps"], r
      assert r["mean_abs_bias_steps"] < 0.05, r
    else:
      assert 0.2 < r["mean_abs_bias_steps"] <= 0.5, r
  kmax = max(fp8_sections.StudySizes.quick().sr_ks)
  sums = {(r["distribution"], r["format"], r["rounding"], r["k"]): r for r in results["sr_sum"]}
  # Round to nearest accumulates a bias on positive data; rounding up-scaled SR does not.
  assert abs(sums[("narrow positive", "mxfp4", "nearest", kmax)]["bias_z"]) > 10
  for dist in ("narrow positive", "log-normal"):
    assert abs(sums[(dist, "mxfp4_rceil", "stochastic", kmax)]["bias_z"]) < 4
    for name in mx_sections.SR_FORMATS:
      assert abs(sums[(dist, name, "stochastic", kmax)]["in_range_bias_z"]) < 4, (dist, name)
  slope = mx_sections.growth_exponent
  assert slope(results["sr_sum"], distribution="narrow positive", format="mxfp4",
               rounding="nearest") > 0.85
  assert slope(results["sr_sum"], distribution="narrow positive", format="mxfp4",
               rounding="stochastic") < 0.8


def test_hadamard_alone_is_exact_to_float32_rounding(quick_report):
  results = quick_report[0]
  for r in results["hadamard_exact"]:
    assert r["rel_diff"] < 8 * r["unit_roundoff"], r
    assert r["f32_gemm_rel_err"] < 1e-5, r
  had = {(r["magnitude"], r["format"], r["hadamard"]): r["norm_rel"]
         for r in results["hadamard"]}
  # No outliers: a Gaussian block stays Gaussian, the transform changes little.
  for name in mx_sections.HADAMARD_FORMATS:
    assert abs(had[(1.0, name, True)] - had[(1.0, name, False)]) < 0.01, name
    assert all(0.01 < had[(m, name, h)] < 0.5 for m in (1.0, 64.0) for h in (False, True))
  # Outlier tokens: the transform helps MXFP4's power-of-two scales.
  assert had[(64.0, "mxfp4", True)] < had[(64.0, "mxfp4", False)] - 0.01
