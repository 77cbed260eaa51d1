"""The validation matrix's run-level figure (PNG; matplotlib is imported on use).

    path = draw("out/validation", matrix)          # <out>/validation.png

Left: the LM loss of each recipe over training, the mean over seeds with the seeds' range as
a band. Right: each recipe's gap to BF16 of the same seed, ``(loss - loss_bf16) /
loss_bf16``, over training, mean and range over seeds. Losses are smoothed by a centred
moving mean over ``smooth`` logged steps (every run shares the data order, so the batches'
own difficulty cancels in the gap, not in the loss).
"""

from __future__ import annotations

import pathlib

import numpy as np

from fp8jax.study.common import results_io
from fp8jax.study.runs.overlay import load_run
from fp8jax.study.runs.validation import DONE, REFERENCE, Matrix, run_name


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
  """Centred moving mean over ``window`` points (shorter at the ends; at most n); float64
  [n]."""
  window = min(window, values.size)
  if window <= 1:
    return values
  kernel = np.ones(window)
  num = np.convolve(values, kernel, mode="same")
  den = np.convolve(np.ones_like(values), kernel, mode="same")
  return num / den


def curves(out, matrix: Matrix, metric: str = "lm_loss", smooth: int = 5
           ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
  """(steps [T], loss per recipe [seeds, T], gap per recipe [seeds, T]) over the finished
  runs, on the reference's logged steps of the first seed (NaN where a run has no row)."""
  out = pathlib.Path(out)
  runs = {(r, s): load_run(out / "runs" / run_name(r, s)) for r, s in matrix.runs()
          if (out / "runs" / run_name(r, s) / DONE).exists()}
  first = next((runs[(REFERENCE, s)] for s in matrix.seeds if (REFERENCE, s) in runs), None)
  if first is None:
    raise ValueError(f"{out}: no finished {REFERENCE} run to draw against")
  steps = np.asarray(first.steps)
  loss, gap = {}, {}
  for recipe in matrix.recipes:
    per_seed, gaps = [], []
    for s in matrix.seeds:
      if (recipe, s) not in runs:
        continue
      v = _smooth(runs[(recipe, s)].series(metric, list(steps)), smooth)
      per_seed.append(v)
      if (REFERENCE, s) in runs:
        ref = _smooth(runs[(REFERENCE, s)].series(metric, list(steps)), smooth)
        gaps.append((v - ref) / ref)
    if per_seed:
      loss[recipe], gap[recipe] = np.stack(per_seed), np.stack(gaps) if gaps else None
  return steps, loss, gap


def draw(out, matrix: Matrix, metric: str = "lm_loss", smooth: int = 5,
         skip_steps: int = 100) -> pathlib.Path:
  """Writes ``<out>/validation.png`` (two panels, from step ``skip_steps`` on, or every
  step of a run shorter than that) and returns its path."""
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

  steps, loss, gap = curves(out, matrix, metric, smooth)
  keep = steps >= skip_steps
  if not keep.any():
    keep[:] = True
  fig = Figure(figsize=(13, 4.6), layout="constrained")
  ax_loss, ax_gap = fig.subplots(1, 2)
  for i, recipe in enumerate(loss):
    color = f"C{i % 10}"
    for ax, values in ((ax_loss, loss[recipe]), (ax_gap, gap[recipe])):
      if values is None:
        continue
      v = values[:, keep]
      ax.plot(steps[keep], np.nanmean(v, 0), color=color, lw=1.2,
              label=f"{recipe} ({v.shape[0]} seeds)")
      if v.shape[0] > 1:
        ax.fill_between(steps[keep], np.nanmin(v, 0), np.nanmax(v, 0), color=color,
                        alpha=0.15, lw=0)
  ax_loss.set(xlabel="step", ylabel=f"{metric} (nats/token, smoothed)",
              title="loss: mean over seeds, band = range")
  ax_gap.axhline(0, color="k", lw=0.6)
  ax_gap.set(xlabel="step", ylabel="gap to BF16 of the same seed",
             title="relative gap: mean over seeds, band = range")
  ax_gap.yaxis.set_major_formatter(lambda y, _: f"{100 * y:+.1f}%")
  ax_gap.legend(fontsize=7, ncols=2)
  path = pathlib.Path(out) / "validation.png"
  results_io.save_figure(fig, path, dpi=100)
  return path
