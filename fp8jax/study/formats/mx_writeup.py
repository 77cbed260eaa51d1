"""Figures and markdown of the MX / NVFP4 sections (:mod:`fp8jax.study.formats.mx_sections`).

:func:`write_figures` and :func:`markdown` take the results dict (the tables of
``mx_sections.run_all``, inside ``numerics.json``); :mod:`fp8jax.study.formats.writeup`
calls them after its own sections. Every number in the text is computed from the rows.
matplotlib is imported only inside :func:`write_figures`.
"""

from __future__ import annotations

import math
import pathlib

from fp8jax.study.common import results_io
from fp8jax.study.formats import mx_sections

FIGURES = ("formats_snr.png", "stochastic_rounding.png", "hadamard_wgrad.png")


def _rows(table, **match):
  return [r for r in table if all(r[k] == v for k, v in match.items())]


def _one(table, **match):
  return _rows(table, **match)[0]


def _pct(v: float) -> str:
  return f"{100 * v:.2f}%"


def write_figures(results: dict, out: pathlib.Path) -> list[str]:
  """Writes the three PNG figures into ``out``; returns their file names."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  snr = results["formats_snr"]
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  for name in dict.fromkeys(r["format"] for r in snr):
    rows = _rows(snr, format=name)
    ratios = [r["outlier_ratio"] for r in rows]
    style = {"marker": "o", "ls": "--" if "fp8" in name or "deepseek" in name else "-"}
    axes[0].plot(ratios, [r["snr_db"] for r in rows], label=name, **style)
    axes[1].plot(ratios, [r["bulk_snr_db"] for r in rows], label=name, **style)
    axes[2].plot(ratios, [100 * r["saturated_frac"] for r in rows], label=name, **style)
  for ax, title in zip(axes, ("SNR, all elements (dB)", "SNR, ordinary channels (dB)",
                              "saturated elements (%)")):
    ax.set(xscale="log", xlabel="outlier ratio r", title=title)
  handles, labels = axes[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
  fig.suptitle("Formats with 1% outlier channels (x r)")
  fig.tight_layout(rect=(0, 0.07, 1, 1))
  results_io.save_figure(fig, out / FIGURES[0], dpi=120)
  plt.close(fig)

  bias, sums = results["sr_bias"], results["sr_sum"]
  dists = list(dict.fromkeys(r["distribution"] for r in sums))
  fig, axes = plt.subplots(1, 1 + len(dists), figsize=(4.5 * (1 + len(dists)), 4.2))
  labels = [f"{r['format']}\n{r['rounding'][:4]}" for r in bias]
  axes[0].bar(range(len(bias)), [r["mean_abs_bias_steps"] for r in bias],
              color=["C0" if r["rounding"] == "nearest" else "C1" for r in bias])
  axes[0].set_xticks(range(len(bias)), labels, fontsize=7, rotation=45)
  axes[0].set(yscale="log", ylabel="mean |bias| / rounding step",
              title=f"per-element bias ({max(r['keys'] for r in bias)} keys)")
  color = {n: f"C{i}" for i, n in enumerate(mx_sections.SR_FORMATS)}
  ks = sorted({r["k"] for r in sums})
  for ax, dist in zip(axes[1:], dists):
    for (name, rounding) in mx_sections.sr_specs():
      rows = _rows(sums, distribution=dist, format=name, rounding=rounding)
      ax.plot([r["k"] for r in rows], [r["rms"] for r in rows], marker="o", color=color[name],
              ls="-" if rounding == "stochastic" else "--", label=f"{name} {rounding}")
    ax.set(xscale="log", yscale="log", xlabel="K", title=dist)
    ax.set_xticks(ks, [str(k) for k in ks], rotation=45)
    ax.minorticks_off()
  axes[1].set_ylabel("rms error of the sum over K")
  axes[1].legend(fontsize=7)
  fig.suptitle("Stochastic (solid) vs nearest (dashed) rounding")
  fig.tight_layout()
  results_io.save_figure(fig, out / FIGURES[1], dpi=120)
  plt.close(fig)

  had = results["hadamard"]
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  for i, name in enumerate(dict.fromkeys(r["format"] for r in had)):
    for rht in (False, True):
      rows = _rows(had, format=name, hadamard=rht)
      ax.plot([r["magnitude"] for r in rows], [r["norm_rel"] for r in rows], marker="o",
              color=f"C{i}", ls="-" if rht else "--",
              label=f"{name}" + (" + RHT" if rht else ""))
  ax.set(xscale="log", xlabel="outlier token magnitude m", ylabel="||dW_q - dW|| / ||dW||",
         title="Wgrad X^T dY: with / without the 16-point RHT")
  ax.legend(fontsize=8)
  fig.tight_layout()
  results_io.save_figure(fig, out / FIGURES[2], dpi=120)
  plt.close(fig)
  return list(FIGURES)


def _clip_threshold(preset: str) -> float:
  """Mantissa of a block amax above which the OCP rule clips it (round to nearest)."""
  fmt = mx_sections.spec_of(preset).fmt
  half_ulp = 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
  return (fmt.max + half_ulp) / 2.0**fmt.emax


def _formats_md(results: dict, figure: str) -> list[str]:
  snr = results["formats_snr"]
  names = list(dict.fromkeys(r["format"] for r in snr))
  ratios = list(dict.fromkeys(r["outlier_ratio"] for r in snr))
  lo, hi = ratios[0], ratios[-1]
  lines = ["## 5. MX and NVFP4 formats with outlier channels", "",
           f"Activations N(0, 1) [{results['sizes']['tokens']}, {results['sizes']['channels']}]"
           " with 1% of the channels multiplied by r; each format's blocks run along the "
           "channels. SNR of all elements (dB):", "",
           "| format | " + " | ".join(f"r={r:g}" for r in ratios) + " |",
           "|---" * (len(ratios) + 1) + "|"]
  for name in names:
    lines.append(f"| {name} | " + " | ".join(
        f"{_one(snr, format=name, outlier_ratio=r)['snr_db']:.1f}" for r in ratios) + " |")
  lines += ["", f"At r = {hi:g}: SNR of the ordinary and the outlier channels, the share of "
            "ordinary elements that sit in a block with an outlier channel (and the SNR they "
            "would give if all of those were flushed, -10 log10(share)), and the saturated "
            f"elements over all ratios:", "",
            "| format | all | ordinary | outliers | shared | -10 log10(shared) | "
            "saturated | flushed to 0 |", "|---|---|---|---|---|---|---|---|"]
  for name in names:
    r = _one(snr, format=name, outlier_ratio=hi)
    sat = [x["saturated_frac"] for x in _rows(snr, format=name)]
    flush = -10 * math.log10(r["bulk_shared_frac"]) + 0.0 if r["bulk_shared_frac"] else math.inf
    lines.append(f"| {name} | {r['snr_db']:.1f} | {r['bulk_snr_db']:.1f} | "
                 f"{r['outlier_snr_db']:.1f} | {_pct(r['bulk_shared_frac'])} | {flush:.1f} | "
                 f"{_pct(min(sat))}-{_pct(max(sat))} | {_pct(r['underflow_frac'])} |")
  saturating = [n for n in names if max(x["saturated_frac"] for x in _rows(snr, format=n)) > 0]
  always = [n for n in saturating if min(x["saturated_frac"] for x in _rows(snr, format=n)) > 0]
  clean = [n for n in names if n not in saturating]

  def at(name, r, key="snr_db"):
    return _one(snr, format=name, outlier_ratio=r)[key]
  text = (f"- **Where the OCP rule saturates.** Saturating: {', '.join(saturating) or 'none'}"
          f" (at every ratio, r = {lo:g} included: {', '.join(always) or 'none'}); never: "
          f"{', '.join(clean) or 'none'}. The OCP scale is 2**(floor(log2 amax) - emax): a "
          f"block whose amax has a mantissa above {_clip_threshold('mxfp8_ocp'):g} (E4M3), "
          f"{_clip_threshold('mxfp6_e2m3'):g} (E2M3) or {_clip_threshold('mxfp4'):g} (E2M1) "
          "maps it beyond the largest element, whatever r is. What r changes is the cost: "
          "once the outliers carry the energy, their clipping sets the overall SNR")
  if {"mxfp8", "mxfp8_ocp"} <= set(names):
    text += (f" (mxfp8_ocp {at('mxfp8_ocp', hi):.1f} dB vs mxfp8 {at('mxfp8', hi):.1f} dB "
             f"at r = {hi:g}; {at('mxfp8_ocp', lo):.1f} vs {at('mxfp8', lo):.1f} at r = {lo:g})")
  if {"mxfp4", "mxfp4_rceil"} <= set(names):
    text += (f"; for FP4, mxfp4 {at('mxfp4', lo):.1f} vs mxfp4_rceil "
             f"{at('mxfp4_rceil', lo):.1f} dB at r = {lo:g} (the round-up rule never clips "
             f"but its scale is up to 2x coarser) and {at('mxfp4', hi):.1f} vs "
             f"{at('mxfp4_rceil', hi):.1f} dB at r = {hi:g}")
  lines += ["", text + "."]
  fp4 = [n for n in names if n in ("mxfp4", "mxfp4_rceil", "nvfp4", "mxfp6_e2m3")]
  fp8 = [n for n in names if n not in fp4]
  if fp4 and fp8:
    b8 = [at(n, hi, "bulk_snr_db") for n in fp8]
    lines.append(
        f"- **The ordinary channels.** At r = {hi:g} the FP8 formats keep their SNR on the "
        f"ordinary channels ({min(b8):.1f}-{max(b8):.1f} dB). The FP6/FP4 formats lose the "
        "ordinary values that share a block with an outlier (E2M1's smallest non-zero "
        "magnitude is 1/12 of its largest, E2M3's 1/60): "
        + ", ".join(f"{n} {at(n, hi, 'bulk_snr_db'):.1f} dB (if all shared values were "
                    f"flushed: {-10 * math.log10(max(at(n, hi, 'bulk_shared_frac'), 1e-12)):.1f})"
                    for n in fp4)
        + ". The block size sets how many ordinary values share a block with an outlier: "
        + ", ".join(f"{n} {_pct(at(n, hi, 'bulk_shared_frac'))}" for n in fp4) + ".")
  if {"nvfp4", "mxfp4"} <= set(names):
    lines.append(
        "- **NVFP4's two-level scale.** The E4M3 block scale puts a block's largest element "
        "within E4M3's rounding of the top of the E2M1 grid: the outlier channels come out "
        f"at {at('nvfp4', hi, 'outlier_snr_db'):.1f} dB against "
        f"{at('mxfp4', hi, 'outlier_snr_db'):.1f} dB under MXFP4's power-of-two scale, and "
        f"NVFP4's overall SNR goes from {at('nvfp4', lo):.1f} dB at r = {lo:g} to "
        f"{at('nvfp4', hi):.1f} dB at r = {hi:g}, where the outliers dominate. The FP32 "
        "per-tensor level maps the tensor's amax to 6 x 448, so an ordinary block's E4M3 "
        "scale stays normal while the tensor's amax is below 448 x 2**6 times the block's.")
  return lines + ["", f"![formats]({figure})", ""]


def _sr_md(results: dict, figure: str) -> list[str]:
  bias, sums = results["sr_bias"], results["sr_sum"]
  keys = max(r["keys"] for r in bias)
  lines = ["## 6. Stochastic rounding", "",
           f"**Bias.** x ~ N(0, 1) ({bias[0]['elements']} elements) quantized with {keys} "
           "independent keys; bias_i = mean over keys of x_hat_i - x_i, in units of the "
           "rounding step at x_i. Elements within range (|x s| <= the largest element):", "",
           "| format | rounding | mean abs bias | max abs bias | Hoeffding bound (p=0.999) | "
           "in range | saturated: mean abs bias |", "|---|---|---|---|---|---|---|"]
  for r in bias:
    bound = "-" if r["hoeffding_steps"] is None else f"{r['hoeffding_steps']:.3f}"
    lines.append(f"| {r['format']} | {r['rounding']} | {r['mean_abs_bias_steps']:.4f} | "
                 f"{r['max_abs_bias_steps']:.3f} | {bound} | {_pct(r['in_range_frac'])} | "
                 f"{r['saturated_mean_abs_bias_steps']:.3f} |")
  rn = [r["mean_abs_bias_steps"] for r in bias if r["rounding"] == "nearest"]
  sr = [r for r in bias if r["rounding"] == "stochastic"]
  within = all(r["max_abs_bias_steps"] <= r["hoeffding_steps"] for r in sr)
  lines += ["", f"Round to nearest is biased per element: mean |bias| {min(rn):.3f}-"
            f"{max(rn):.3f} steps (1/4 for values spread uniformly over a step). Stochastic "
            f"rounding: {min(r['mean_abs_bias_steps'] for r in sr):.4f}-"
            f"{max(r['mean_abs_bias_steps'] for r in sr):.4f} steps, the largest "
            f"{'within' if within else 'NOT within'} the Hoeffding bound of an unbiased "
            "rounding. Saturated elements (|x s| beyond the largest element: NVFP4 block "
            "maxima whose E4M3 block scale rounded down, OCP-rule clipping) are clipped under "
            "either rounding and keep their bias.", ""]
  kmax = max(r["k"] for r in sums)
  lines += [f"**Long sums.** sum_k Q(x_k) against the float64 sum, "
            f"{results['sizes']['sr_trials']} trials; at K = {kmax}: relative rms error, the "
            "bias's z-score (mean error / its standard error; all elements, and the in-range "
            "elements only), and the growth exponent of the rms error in K "
            "(0.5: random walk, 1: bias):", "",
            "| distribution | format | rounding | rel. rms | bias z | in-range bias z | "
            "exponent |", "|---|---|---|---|---|---|---|"]
  exps = {}
  for dist in dict.fromkeys(r["distribution"] for r in sums):
    for (name, rounding) in mx_sections.sr_specs():
      r = _one(sums, distribution=dist, format=name, rounding=rounding, k=kmax)
      exps[(dist, name, rounding)] = e = mx_sections.growth_exponent(
          sums, distribution=dist, format=name, rounding=rounding)
      lines.append(f"| {dist} | {name} | {rounding} | {r['rel_rms']:.2e} | "
                   f"{r['bias_z']:+.1f} | {r['in_range_bias_z']:+.1f} | {e:.2f} |")

  def at(dist, rounding, key):
    return {n: _one(sums, distribution=dist, format=n, rounding=rounding, k=kmax)[key]
            for n in mx_sections.SR_FORMATS}
  zm = [v for (d, _, _), v in exps.items() if d == "zero-mean"]
  ratio = [at("zero-mean", "stochastic", "rms")[n] / at("zero-mean", "nearest", "rms")[n]
           for n in mx_sections.SR_FORMATS]
  rn_np = at("narrow positive", "nearest", "bias_z")
  sr_np = at("narrow positive", "stochastic", "bias_z")
  sr_ln = at("log-normal", "stochastic", "bias_z")
  sr_ln_in = at("log-normal", "stochastic", "in_range_bias_z")
  unbiased = [n for n in mx_sections.SR_FORMATS
              if abs(sr_np[n]) < 3 and abs(sr_ln[n]) < 3]
  biased = [n for n in mx_sections.SR_FORMATS if abs(sr_ln[n]) >= 3 or abs(sr_np[n]) >= 3]
  clipped = [n for n in biased if abs(sr_ln_in[n]) < 3
             and abs(at("narrow positive", "stochastic", "in_range_bias_z")[n]) < 3]
  lines += ["", f"- Zero-mean data: the errors grow like random walks (exponents {min(zm):.2f}-"
            f"{max(zm):.2f}); stochastic rounding's rms error is {min(ratio):.1f}-"
            f"{max(ratio):.1f}x round to nearest's"
            + (" (a rounding to one of the two neighbours at random has the larger "
               "per-element variance)." if min(ratio) > 1 else "."),
            "- Positive data: round to nearest is biased (narrow positive: z = "
            + ", ".join(f"{n} {v:+.0f}" for n, v in rn_np.items()) + "; exponents "
            + ", ".join(f"{exps[('narrow positive', n, 'nearest')]:.2f}"
                        for n in mx_sections.SR_FORMATS)
            + ", where 1 means a relative error that does not shrink with K). Stochastic "
            "rounding is unbiased (|z| < 3 on both positive distributions) for "
            + (", ".join(unbiased) if unbiased else "none of the formats") + "."]
  if biased:
    lines.append(
        "- Stochastic rounding stays biased for " + ", ".join(biased) + ": z = "
        + ", ".join(f"{n} {sr_np[n]:+.1f} / {sr_ln[n]:+.1f} (narrow positive / log-normal)"
                    for n in biased)
        + "; over the in-range elements only, log-normal z = "
        + ", ".join(f"{n} {sr_ln_in[n]:+.1f}" for n in biased) + ". "
        + ("For " + ", ".join(clipped) + " the bias is all in the saturated elements: block "
           "maxima clipped to the largest element (NVFP4: the E4M3 block scale rounded to "
           "nearest can put the block's amax up to 1/16 above 6; MXFP4: the OCP rule), which "
           "no rounding of the in-range elements undoes. A round-up scale rule (mxfp4_rceil) "
           "never saturates." if clipped else ""))
  lines += [
            "", f"![stochastic rounding]({figure})", ""]
  return lines


def _hadamard_md(results: dict, figure: str) -> list[str]:
  had, exact = results["hadamard"], results["hadamard_exact"]
  fmts = list(dict.fromkeys(r["format"] for r in had))
  mags = list(dict.fromkeys(r["magnitude"] for r in had))
  lines = ["## 7. The random Hadamard transform on Wgrad operands", "",
           f"dW = X^T dY over {results['sizes']['rht_tokens']} tokens, X and dY [tokens, 128] "
           "N(0, 1), 1/64 of X's tokens multiplied by m. Both operands quantized along the "
           f"tokens (round to nearest), after the {mx_sections.RHT_SIZE}-point random "
           "Hadamard transform along the tokens or not; the dequantized product (float64) "
           "against the float64 product, normwise relative error:", "",
           "| m | " + " | ".join(f"{f} | {f} + RHT" for f in fmts) + " |",
           "|---" * (1 + 2 * len(fmts)) + "|"]
  for m in mags:
    lines.append(f"| {m:g} | " + " | ".join(
        _pct(_one(had, format=f, magnitude=m, hadamard=h)["norm_rel"])
        for f in fmts for h in (False, True)) + " |")
  worst = max(r["rel_diff"] for r in exact)
  lines += ["", f"Without quantization the transform changes the product by at most "
            f"{worst:.1e} (normwise, relative; {worst / exact[0]['unit_roundoff']:.1f} "
            "float32 unit roundoffs), less than the plain float32 GEMM's own rounding "
            f"({min(r['f32_gemm_rel_err'] for r in exact):.1e}): it is exact up to float32 "
            "rounding, and every difference in the table comes from quantization.", ""]
  for f in fmts:
    d = {m: _one(had, format=f, magnitude=m, hadamard=True)["norm_rel"]
         - _one(had, format=f, magnitude=m, hadamard=False)["norm_rel"] for m in mags}
    out = {m: v for m, v in d.items() if m != mags[0]} or d
    lo_m, hi_m = min(out, key=out.get), max(out, key=out.get)
    lines.append(f"- {f}: the transform changes the error by {100 * d[mags[0]]:+.2f} points "
                 f"at m = {mags[0]:g}, and by {100 * out[lo_m]:+.2f} (m = {lo_m:g}) to "
                 f"{100 * out[hi_m]:+.2f} (m = {hi_m:g}) points with outliers.")
  mean = {f: sum(_one(had, format=f, magnitude=m, hadamard=True)["norm_rel"]
                 - _one(had, format=f, magnitude=m, hadamard=False)["norm_rel"]
                 for m in mags[1:]) / max(len(mags) - 1, 1) for f in fmts}
  if mean.get("mxfp4", 0) < 0 < mean.get("nvfp4", 0):
    lines += ["", "On average over m > 1 the transform helps MXFP4 and hurts NVFP4. A "
              "transformed block is Gaussian-like: that helps MXFP4, whose power-of-two scale "
              "and 32-element blocks otherwise put an outlier token anywhere in the top binade "
              "and flush its ordinary neighbours. NVFP4 already represents a block's largest "
              "element to the E4M3 scale's precision and loses at most 15 neighbours per "
              "outlier; spreading the outlier over 16 FP4-rounded values costs more than that."]
  lines += ["", "This is one product's error on synthetic data; the NVFP4 recipe's case for "
            "the transform rests on training runs (arXiv 2509.25149), not reproduced here.",
            "", f"![hadamard]({figure})", ""]
  return lines


def markdown(results: dict, figures: list[str]) -> list[str]:
  """The markdown lines of sections 5-7 (``figures``: :func:`write_figures`'s names)."""
  return (_formats_md(results, figures[0]) + _sr_md(results, figures[1])
          + _hadamard_md(results, figures[2]))


def headline(results: dict) -> str:
  """One line of the sections' main numbers, for the binary's log."""
  snr, bias = results["formats_snr"], results["sr_bias"]
  hi = max(r["outlier_ratio"] for r in snr)
  nv = _one(snr, format="nvfp4", outlier_ratio=hi)
  sat = max(r["saturated_frac"] for r in _rows(snr, format="mxfp4"))
  sr = max(r["mean_abs_bias_steps"] for r in bias if r["rounding"] == "stochastic")
  rn = min(r["mean_abs_bias_steps"] for r in bias if r["rounding"] == "nearest")
  worst = max(r["rel_diff"] for r in results["hadamard_exact"])
  return (f"nvfp4 at outlier ratio {hi:g}: SNR {nv['snr_db']:.1f} dB (ordinary channels "
          f"{nv['bulk_snr_db']:.1f}); mxfp4 (OCP) saturates up to {_pct(sat)}; mean |bias| "
          f"RN >= {rn:.3f} steps, SR <= {sr:.4f}; RHT alone changes X^T dY by <= {worst:.1e}")
