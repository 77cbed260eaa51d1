"""Figures of the precision comparison report (PNG files; matplotlib is imported on use).

Every function draws one figure of a loaded sweep (:func:`fp8jax.study.common.results.load`) into
``out_dir`` and returns the path of the PNG. They build :class:`matplotlib.figure.Figure`
objects directly (no pyplot state and no backend switch), so notebooks can call them too.
Centers are over the finite rows of each checkpoint (geometric means for positive metrics,
arithmetic means otherwise), bands are their 95% intervals (:func:`fp8jax.study.common.stats.stat`).
The reference is labelled by its precision (:attr:`fp8jax.study.common.results.Results.reference`:
"FP32 reference", gradient ``g_fp32``, for a model that computes in FP32).
"""

from __future__ import annotations

import math
import pathlib
import re
from typing import Any

import numpy as np

from fp8jax.metrics import paths as paths_lib
from fp8jax.metrics import rows as metrics_rows
from fp8jax.study.common import results, results_io, stats
from fp8jax.study.comparison import conditioning, floor, questions
from fp8jax.study.comparison import format_width as width_lib

NAMES = ("loss_curves", "grad_error", "loss_vs_grad", "weight_norms", "heatmaps",
         "migration", "routing", "format_width", "noise_floor")
"""The figures of :func:`write_all`, in report order (file ``<name>.png``); the metrics each
plots are registered in :mod:`fp8jax.study.common.metric_registry` (``Metric.figures``)."""

_ROUTING = re.compile(r"^routing/(\d+)/topk_set_diff_frac$")


def _figure(n_panels: int, ncols: int = 4, size: tuple[float, float] = (4.2, 3.2)):
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
  n_panels = max(1, n_panels)
  ncols = max(1, min(ncols, n_panels))
  nrows = math.ceil(n_panels / ncols)
  fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
  axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
  for ax in axes[n_panels:]:
    ax.set_visible(False)
  return fig, axes


def _save(fig, out_dir: str | pathlib.Path, name: str) -> pathlib.Path:
  path = pathlib.Path(out_dir) / f"{name}.png"
  path.parent.mkdir(parents=True, exist_ok=True)
  results_io.save_figure(fig, path, dpi=100)
  return path


def _empty(ax, text: str = "no data") -> None:
  ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
  ax.set_xticks([])
  ax.set_yticks([])


def series(res: results.Results, metric: str, policy: str) -> tuple[np.ndarray, ...]:
  """``(steps, mean, lo, hi)`` float arrays of a metric per checkpoint (NaN: none)."""
  st = [stats.stat(res, metric, policy, [s]) for s in res.steps]
  return (np.asarray(res.steps, np.float64), np.array([s.mean for s in st]),
          np.array([s.lo for s in st]), np.array([s.hi for s in st]))


def _band(ax, res, metric: str, policy: str, label: str, **kw) -> None:
  x, mean, lo, hi = series(res, metric, policy)
  _band_of(ax, x, mean, lo, hi, label, **kw)


def _band_of(ax, x, mean, lo, hi, label: str, **kw) -> None:
  line, = ax.plot(x, mean, marker="o", ms=3, label=label, **kw)
  if ax.get_yscale() == "log":  # a t-interval can reach below 0: clip it at mean / 10
    lo = np.where(lo > 0, lo, mean / 10)
  ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)


def _log_if_positive(ax, values) -> None:
  v = np.asarray([x for x in values if x is not None], np.float64)
  v = v[np.isfinite(v)]
  if v.size and (v > 0).all():
    ax.set_yscale("log")


def reference_gradient(res: results.Results) -> str:
  """The reference's gradient in the figures' labels: ``g_bf16``, ``g_fp32``, ..."""
  return f"g_{res.reference.lower()}"


def loss_curves(res: results.Results, out_dir) -> pathlib.Path:
  """(a) The reference's and the policy's loss (nats/token) over checkpoints, one panel
  per policy."""
  fig, axes = _figure(len(res.policies))
  for ax, p in zip(axes, res.policies):
    _band(ax, res, "loss_bf16", p, f"{res.reference} reference", color="k")
    _band(ax, res, "loss_fp8", p, "policy", color="tab:red", ls="--")
    ax.set(title=p, xlabel="checkpoint step", ylabel="loss")
    ax.legend(fontsize=7)
  fig.suptitle(f"Loss of the {res.reference} reference and the policy on the same batches")
  return _save(fig, out_dir, "loss_curves")


def grad_error(res: results.Results, out_dir) -> pathlib.Path:
  """(b) ||g_fp8 - g_ref|| and the relative error over checkpoints, a line per policy."""
  fig, axes = _figure(2, size=(6.0, 4.0))
  g = reference_gradient(res)
  for ax, metric, label in ((axes[0], "diff_norm", f"||g_fp8 - {g}||"),
                            (axes[1], "rel_err", f"||g_fp8 - {g}|| / ||{g}||")):
    _log_if_positive(ax, [r.get(metric) for r in res.rows if r["finite"]])
    for p in res.policies:
      _band(ax, res, metric, p, p)
    ax.set(xlabel="checkpoint step", ylabel=label, title=metric)
  axes[1].legend(fontsize=7)
  fig.suptitle("Gradient difference (geometric mean and 95% CI over batches)")
  return _save(fig, out_dir, "grad_error")


def loss_vs_grad(res: results.Results, out_dir) -> pathlib.Path:
  """(c) Loss relative error against gradient relative error, one point per finite row
  (log axes when every plotted value is positive)."""
  fig, axes = _figure(1, size=(6.0, 4.5))
  ax = axes[0]
  pts = {p: np.array([[r.get("rel_err", math.nan), r.get("loss_rel_err", math.nan)]
                      for r in res.rows_of(p) if r["finite"]], np.float64).reshape(-1, 2)
         for p in res.policies}
  pts = {p: v[np.isfinite(v).all(1)] for p, v in pts.items()}
  every = np.concatenate(list(pts.values()) or [np.zeros((0, 2))])
  log = every.size and (every > 0).any(0).all()
  for p, v in pts.items():
    v = v[(v > 0).all(1)] if log else v
    ax.scatter(v[:, 0], v[:, 1], s=10, label=p, alpha=0.7)
  if log:
    ax.set(xscale="log", yscale="log")
  ax.set(xlabel="gradient relative error", ylabel="loss relative error",
         title="Loss alignment vs gradient perturbation")
  if every.size:
    ax.legend(fontsize=7)
  else:
    _empty(ax)
  return _save(fig, out_dir, "loss_vs_grad")


def weight_norms(res: results.Results, out_dir) -> pathlib.Path:
  """(d) The checkpoints' weight norms: global and per module."""
  fig, axes = _figure(2, size=(6.0, 4.0))
  rows = sorted(res.weights, key=lambda w: w["step"])
  steps = [w["step"] for w in rows]
  keys = [k for k in dict.fromkeys(k for w in rows for k in w) if k.startswith("weight_norm/")]
  if "weight_norm/global" in keys:
    axes[0].plot(steps, [w.get("weight_norm/global", math.nan) for w in rows], marker="o")
  else:
    _empty(axes[0])
  modules = [k for k in keys if k != "weight_norm/global"]
  for k in modules:
    axes[1].plot(steps, [w.get(k, math.nan) for w in rows], marker="o", ms=3,
                 label=k.split("/", 1)[1])
  if modules:
    _log_if_positive(axes[1], [w.get(k) for w in rows for k in modules])
    axes[1].legend(fontsize=7, ncol=2)
  else:
    _empty(axes[1])
  axes[0].set(title="global", xlabel="checkpoint step", ylabel="||W||")
  axes[1].set(title="per module", xlabel="checkpoint step", ylabel="||W||")
  fig.suptitle("Weight norm of the checkpoints")
  return _save(fig, out_dir, "weight_norms")


def module_layer_table(res: results.Results, policy: str, step: int,
                       classifier: paths_lib.Classifier | None = None
                       ) -> tuple[list[str], list[int], np.ndarray]:
  """``(modules, layers, table)``: the mean diff_norm of each module x layer cell at one
  checkpoint (NaN where absent), modules in the table order of ``classifier`` (default:
  the sweep's, :attr:`fp8jax.study.common.results.Results.classifier`)."""
  return metrics_rows.module_layer_grid(
      stats.mean_details(res, policy, step, "module_layer"), classifier or res.classifier)


def heatmaps(res: results.Results, out_dir) -> pathlib.Path:
  """(e) Module x layer diff_norm per policy at the last checkpoint with details."""
  from matplotlib import colors  # pylint: disable=import-outside-toplevel
  fig, axes = _figure(len(res.policies), ncols=2, size=(6.0, 3.6))
  for ax, p in zip(axes, res.policies):
    steps = [s for s in res.steps if res.details_of(p, s)]
    if not steps:
      _empty(ax)
      ax.set_title(p)
      continue
    modules, layers, table = module_layer_table(res, p, steps[-1])
    if not table.size:
      _empty(ax)
      continue
    ok = table[np.isfinite(table)]
    norm = colors.LogNorm() if ok.size and (ok > 0).all() else None
    im = ax.imshow(np.ma.masked_invalid(table), aspect="auto", norm=norm, cmap="viridis")
    ax.set_yticks(range(len(modules)), modules, fontsize=7)
    ax.set_xticks(range(len(layers)), [str(x) for x in layers], fontsize=7)
    ax.set(title=f"{p} (step {steps[-1]})", xlabel="layer")
    fig.colorbar(im, ax=ax, label=f"||g_fp8 - {reference_gradient(res)}||")
  fig.suptitle("Gradient difference norm per module and layer")
  return _save(fig, out_dir, "heatmaps")


def migration(res: results.Results, out_dir, redistribution: dict[str, Any] | None = None,
              top_k: int = 10) -> pathlib.Path:
  """(f) Migration of the top-k parameters over checkpoints: overlap and Spearman with the
  first checkpoint, the top-k fraction in directly quantized modules, and share_direct.

  Args:
    redistribution: ``answers(...)["redistribution"]`` (computed when None).
  """
  if redistribution is None:
    redistribution = questions.redistribution_answer(res, top_k)
  per = {p: r for p, r in redistribution.get("policies", {}).items() if r["available"]}
  k = redistribution.get("k", top_k)
  fig, axes = _figure(4, ncols=2, size=(6.0, 3.8))
  panels = (("overlap_first", f"top-{k} overlap with the first checkpoint"),
            ("spearman_first", "Spearman with the first checkpoint"),
            ("direct_share", f"fraction of the top-{k} in direct modules"))
  for ax, (key, title) in zip(axes, panels):
    for p, r in per.items():
      rows = r["migration"]
      ax.plot([m["checkpoint"] for m in rows],
              [math.nan if m.get(key) is None else m[key] for m in rows],
              marker="o", ms=3, label=p)
    ax.set(title=title, xlabel="checkpoint step", ylim=(-0.05 if key != "spearman_first"
                                                        else -1.05, 1.05))
  for p in per:
    _band(axes[3], res, "share_direct", p, p)
  axes[3].set(title=f"share_direct: direct share of ||g_fp8 - {reference_gradient(res)}||^2",
              xlabel="checkpoint step")
  if per:
    axes[0].legend(fontsize=7)
  else:
    for ax in axes:
      _empty(ax)
  fig.suptitle("Migration of the largest gradient differences")
  return _save(fig, out_dir, "migration")


def routing_layers(res: results.Results) -> list[int]:
  """MoE layers with routing divergence in the rows, ascending."""
  found = {int(m.group(1)) for r in res.rows for k in r if (m := _ROUTING.match(k))}
  return sorted(found)


def routing(res: results.Results, out_dir) -> pathlib.Path:
  """(g) Fraction of tokens whose top-k expert set differs, per MoE layer (rows) and
  checkpoint (columns), one panel per policy."""
  layers = routing_layers(res)
  tables = {p: np.array([[stats.stat(res, f"routing/{lay}/topk_set_diff_frac", p, [s]).mean
                          for s in res.steps] for lay in layers]) for p in res.policies}
  finite = [t[np.isfinite(t)] for t in tables.values() if t.size]
  vmax = max([float(f.max()) for f in finite if f.size] + [1e-6])  # one scale for all panels
  fig, axes = _figure(len(res.policies), ncols=2, size=(6.0, 3.6))
  for ax, p in zip(axes, res.policies):
    ax.set_title(p)
    if not layers:
      _empty(ax, "no routing data")
      continue
    im = ax.imshow(np.ma.masked_invalid(tables[p]), aspect="auto", cmap="magma", vmin=0,
                   vmax=vmax)
    ax.set_yticks(range(len(layers)), [str(x) for x in layers], fontsize=7)
    ax.set_xticks(range(len(res.steps)), [str(s) for s in res.steps], fontsize=7,
                  rotation=45)
    ax.set(xlabel="checkpoint step", ylabel="MoE layer")
    fig.colorbar(im, ax=ax, label="top-k set differs (fraction of tokens)")
  fig.suptitle(f"Routing divergence of the policy from the {res.reference} reference")
  return _save(fig, out_dir, "routing")


def format_width(res: results.Results, out_dir) -> pathlib.Path:
  """Per-module relative gradient error of each GEMM recipe of the formats grid, widest
  element format first (log scale); "no data" without such recipes."""
  pols = width_lib.format_policies(res)
  names = [f["policy"] for f in pols]
  mods = width_lib.modules(res, names)
  fig, (ax,) = _figure(1, size=(max(6.0, 0.5 * len(mods) + 3), 3.6))
  if not pols or not mods:
    _empty(ax, "no GEMM-recipe policies (formats grid)")
    return _save(fig, out_dir, "format_width")
  x = np.arange(len(mods))
  for f in pols:
    y = [stats.stat(res, f"module/{m}/rel_err", f["policy"]).mean for m in mods]
    ax.plot(x, y, marker="o" if f["bits"] == 8 else "s",
            linestyle="-" if f["bits"] == 8 else "--", label=f"{f['policy']} ({f['bits']}-bit)")
  ax.set_xticks(x, mods, rotation=60, ha="right", fontsize=7)
  ax.set_yscale("log")
  ax.set_ylabel("relative gradient error")
  ax.set_title("gradient error per module as the format narrows")
  ax.legend(fontsize=7)
  return _save(fig, out_dir, "format_width")


def _stat_arrays(per: dict, steps) -> tuple[np.ndarray, ...]:
  st = [per.get(s) for s in steps]
  return tuple(np.array([getattr(x, k) if x is not None else math.nan for x in st])
               for k in ("mean", "lo", "hi"))


def noise_floor(res: results.Results, out_dir) -> pathlib.Path:
  """The floor per checkpoint with every policy's rel_err, each policy's rel_err as a
  multiple of the floor (lines at 1x and :data:`fp8jax.study.comparison.floor.FLOOR_MULTIPLE`), and
  policy / noise-matched control (line at 1); flagged checkpoints shaded. Log scales."""
  fig, axes = _figure(3, ncols=3, size=(5.0, 3.8))
  x = np.asarray(res.steps, np.float64)
  if not res.floor:
    for ax in axes:
      _empty(ax, "no noise floor in this sweep")
    return _save(fig, out_dir, "noise_floor")
  _band(axes[0], res, "rel_err", res.floor, "floor", color="k", lw=2)
  for p in res.policies:
    axes[0].plot(*series(res, "rel_err", p)[:2], marker=".", lw=1, label=p)
    per = floor.multiples(res, p)["per_step"]
    _band_of(axes[1], x, *_stat_arrays(per, res.steps), p)
    ctrl = floor.control(res, p)
    if ctrl["available"]:
      _band_of(axes[2], x, *_stat_arrays(ctrl["per_step"], res.steps), p)
  for y, ls in ((1.0, "-"), (floor.FLOOR_MULTIPLE, "--")):
    axes[1].axhline(y, color="grey", ls=ls, lw=1)
  axes[2].axhline(1.0, color="grey", lw=1)
  if not res.controls:
    _empty(axes[2], "no noise-matched controls")
  for ax in axes:
    for s in conditioning.flags(res):
      ax.axvspan(s - 0.02 * np.ptp(x), s + 0.02 * np.ptp(x), color="red", alpha=0.15, lw=0)
    if res.controls or ax is not axes[2]:
      ax.set_yscale("log")
      ax.legend(fontsize=6)
  axes[0].set(title="rel_err: floor (band) and policies", xlabel="checkpoint step")
  axes[1].set(title=f"rel_err / floor (dashed: {floor.FLOOR_MULTIPLE:g}x)",
              xlabel="checkpoint step")
  axes[2].set(title="rel_err: policy / noise-matched control", xlabel="checkpoint step")
  fig.suptitle("Against the noise floor and the controls (red: flagged checkpoints)")
  return _save(fig, out_dir, "noise_floor")


def write_all(res: results.Results, out_dir, answers: dict[str, dict] | None = None,
              top_k: int = 10) -> dict[str, pathlib.Path]:
  """Every figure of :data:`NAMES` into ``out_dir``: ``{name: path}``; ``routing`` only
  where the rows hold routing divergence (a model with a router)."""
  redistribution = (answers or {}).get("redistribution")
  out = {}
  for name in NAMES:
    if name == "routing" and not routing_layers(res):
      continue
    fn = globals()[name]
    out[name] = (fn(res, out_dir, redistribution, top_k) if name == "migration"
                 else fn(res, out_dir))
  return out
