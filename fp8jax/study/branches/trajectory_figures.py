"""The figure of "Does the one-step perturbation predict the trajectory?" (a PNG; matplotlib
is imported on use).

:func:`scatter` draws each one-step predictor (x) against the K-step parameter divergence
and relative loss gap (y, dimensionless) of the policy branches of
:func:`fp8jax.study.branches.trajectory.study`, colored by checkpoint, with each checkpoint's noise
floor as a dashed line (parameter divergence) or a band +-floor (loss gap). Axes of positive
values spanning a decade or more are logarithmic.
"""

from __future__ import annotations

import math
import pathlib
from typing import Any

from fp8jax.study.branches import trajectory
from fp8jax.study.common.stats import fmt
from fp8jax.study.comparison import figures

NAME = "trajectory"
"""The file name of the figure (``<NAME>.png``)."""
ROWS = ("param_div", "loss_gap")
"""The outcomes on the y axes, one row of panels each."""


def _log(values) -> bool:
  """Log scale for positive values spanning at least a decade."""
  v = [x for x in values if math.isfinite(x)]
  return bool(v) and min(v) > 0 and max(v) >= 10 * min(v)


def scatter(st: dict[str, Any], out_dir: str | pathlib.Path) -> pathlib.Path:
  """Predictor x outcome scatter with per-checkpoint noise floors; returns the PNG path."""
  from matplotlib import colormaps  # pylint: disable=import-outside-toplevel
  from matplotlib.ticker import NullFormatter  # pylint: disable=import-outside-toplevel
  preds = list(trajectory.PREDICTORS)
  fig, axes = figures._figure(len(ROWS) * len(preds), ncols=len(preds))
  pairs, floors = st["pairs"], st["floors"]
  steps = sorted({p["step"] for p in pairs} | set(floors))
  cmap = colormaps["viridis"]
  color = {s: cmap(i / max(1, len(steps) - 1)) for i, s in enumerate(steps)}
  for r, name in enumerate(ROWS):
    for c, pred in enumerate(preds):
      ax = axes[r * len(preds) + c]
      xs = [p[pred] for p in pairs]
      ys = [p["outcome"][name] for p in pairs]
      if not any(math.isfinite(x) and math.isfinite(y) for x, y in zip(xs, ys)):
        figures._empty(ax, "no data")
        continue
      for s in steps:
        pts = [(x, y) for p, x, y in zip(pairs, xs, ys)
               if p["step"] == s and math.isfinite(x) and math.isfinite(y)]
        if pts:
          ax.scatter(*zip(*pts), s=18, color=color[s], label=f"step {s}")
        f = floors.get(s, {}).get(name, math.nan)
        if math.isfinite(f) and name == "loss_gap":
          ax.axhspan(-f, f, color=color[s], alpha=0.12, lw=0)
        elif math.isfinite(f):
          ax.axhline(f, color=color[s], ls="--", lw=1)
      if _log(xs):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on short spans
      if name == "param_div" and _log(ys + [floors[s].get(name, math.nan) for s in floors]):
        ax.set_yscale("log")
      co = st["correlations"][(pred, name)]
      ax.set_title(f"rho = {fmt(co['rho'])} [{fmt(co['lo'])}, {fmt(co['hi'])}], n = {co['n']}",
                   fontsize=8)
      ax.set(xlabel=trajectory.PREDICTORS[pred], ylabel=trajectory.OUTCOMES[name])
      if r == 0 and c == 0:
        ax.legend(fontsize=7)
  fig.suptitle(f"One-step predictors vs K = {st['k']} step outcomes (dashed / band: the "
               "noise floor per checkpoint)")
  return figures._save(fig, out_dir, NAME)
