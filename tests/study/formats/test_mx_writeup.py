"""The MX / NVFP4 sections' text and figures (``fp8jax.study.formats.mx_writeup``) from a
hand-made results dict: every number the text states is read back from the rows."""

import pytest

from fp8jax.study.formats import mx_sections, mx_writeup

NAMES = ("mxfp8", "mxfp8_ocp", "mxfp4", "nvfp4")


def _results():
  snr = []
  for i, name in enumerate(NAMES):
    for ratio in (1.0, 1024.0):
      snr.append({"format": name, "outlier_ratio": ratio, "snr_db": 30.0 - i - ratio / 1024,
                  "bulk_snr_db": 20.0 + i, "outlier_snr_db": 10.0 + i,
                  "bulk_shared_frac": 0.25 if "4" in name else 0.5,
                  "saturated_frac": 0.01 if name in ("mxfp8_ocp", "mxfp4") else 0.0,
                  "underflow_frac": 0.0})
  bias = [{"format": f, "rounding": r, "keys": 64 if r == "stochastic" else 1,
           "elements": 4096, "in_range_frac": 1.0,
           "mean_abs_bias_steps": 0.01 if r == "stochastic" else 0.25,
           "max_abs_bias_steps": 0.1 if r == "stochastic" else 0.5,
           "saturated_mean_abs_bias_steps": 0.0,
           "hoeffding_steps": 0.3 if r == "stochastic" else None}
          for f, r in mx_sections.sr_specs()]
  sums = [{"distribution": d, "format": f, "rounding": r, "k": k, "bias": 0.0,
           "bias_z": 0.5 if r == "stochastic" else 20.0, "in_range_bias_z": 0.5,
           "rms": k**0.5 * (2 if r == "stochastic" else 1), "rel_rms": 1e-3}
          for d in mx_sections.SUM_DISTRIBUTIONS for f, r in mx_sections.sr_specs()
          for k in (16, 256)]
  had = [{"magnitude": m, "format": f, "hadamard": h, "norm_rel": 0.1 + (0.01 if h else 0)}
         for m in (1.0, 64.0) for f in mx_sections.HADAMARD_FORMATS for h in (False, True)]
  exact = [{"magnitude": 1.0, "rel_diff": 2**-23, "f32_gemm_rel_err": 1e-6,
            "unit_roundoff": 2**-24}]
  return {"sizes": {"tokens": 8, "channels": 64, "rht_tokens": 64, "sr_trials": 4},
          "formats_snr": snr, "sr_bias": bias, "sr_sum": sums, "hadamard": had,
          "hadamard_exact": exact}


def test_headline_states_the_main_numbers():
  assert mx_writeup.headline(_results()) == (
      "nvfp4 at outlier ratio 1024: SNR 26.0 dB (ordinary channels 23.0); mxfp4 (OCP) "
      "saturates up to 1.00%; mean |bias| RN >= 0.250 steps, SR <= 0.0100; RHT alone changes "
      "X^T dY by <= 1.2e-07")


def test_formats_section_tables_and_the_ocp_clip_thresholds():
  text = "\n".join(mx_writeup.markdown(_results(), ["a.png", "b.png", "c.png"]))
  assert "| format | r=1 | r=1024 |" in text
  assert "| mxfp4 | 28.0 | 27.0 |" in text  # snr_db 30 - 2 - r/1024
  # nvfp4 at r = 1024: all, ordinary, outliers, shared, -10 log10(0.25), saturated, flushed.
  assert "| nvfp4 | 26.0 | 23.0 | 13.0 | 25.00% | 6.0 | 0.00%-0.00% | 0.00% |" in text
  assert "Saturating: mxfp8_ocp, mxfp4 (at every ratio, r = 1 included: mxfp8_ocp, mxfp4)" \
      in text
  # (max + half an ulp) / 2**emax: E4M3 (448 + 16) / 256, E2M3 7.75 / 4, E2M1 7 / 4.
  assert "above 1.8125 (E4M3), 1.9375 (E2M3) or 1.75 (E2M1)" in text
  for figure in ("![formats](a.png)", "![stochastic rounding](b.png)", "![hadamard](c.png)"):
    assert figure in text


def test_sr_and_hadamard_sections_read_their_rows():
  text = "\n".join(mx_writeup.markdown(_results(), ["a.png", "b.png", "c.png"]))
  assert "the largest within the Hoeffding bound" in text
  assert "| zero-mean | nvfp4 | stochastic | 1.00e-03 | +0.5 | +0.5 | 0.50 |" in text
  assert "random walks (exponents 0.50-0.50); stochastic rounding's rms error is 2.0-2.0x" \
      in text
  assert "Stochastic rounding stays biased" not in text  # every |z| < 3
  assert "by +1.00 points at m = 1" in text
  results = _results()
  results["sr_bias"][1]["max_abs_bias_steps"] = 0.4  # above its bound 0.3
  assert "NOT within the Hoeffding bound" in "\n".join(
      mx_writeup.markdown(results, ["a", "b", "c"]))


@pytest.mark.slow
def test_write_figures_writes_the_three_pngs(tmp_path):
  assert mx_writeup.write_figures(_results(), tmp_path) == list(mx_writeup.FIGURES)
  for name in mx_writeup.FIGURES:
    assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
