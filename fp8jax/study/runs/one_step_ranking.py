"""Does the one-step comparison rank the recipes as the full runs do? (docs/validation.md)

The predictor: for each seed ``s`` with a BF16 run of the validation matrix's config,
``compare`` took every recipe's one-step gradient error at checkpoints of that run
(``<folder>/s<s>``, a sweep folder; ``scripts/gpu/one_step_loop.sh``). Per recipe,
checkpoint step and seed it is the mean ``rel_err`` = ||g_recipe - g_bf16|| / ||g_bf16||
over the evaluation batches (dimensionless). The outcome: the recipe's full-run gap to BF16
of the same seed (relative tail loss, :func:`fp8jax.study.runs.validation.summarize`).

Per checkpoint step: Spearman's rho over the recipes for each seed, with its two-sided
permutation p-value; the mean rho over seeds with its 95% t-interval on Fisher's z =
atanh(rho) (so that it stays within [-1, 1]); and the rho of the seed-mean predictor
against the seed-mean gap, with a bootstrap interval over recipes. A recipe without a
finite predictor (not compared at that step, or a non-finite row) is left out of the rank;
a step where no recipe has one is left out.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
from typing import Any

import numpy as np

from fp8jax.study.common import results as results_lib
from fp8jax.study.common.correlation import correlate, fmt_p
from fp8jax.study.common.intervals import Stat, mean_ci

_SEED_DIR = re.compile(r"^s(\d+)(?:\.[A-Za-z0-9_-]+)?$")
METRIC = "rel_err"


def load(folder: str | pathlib.Path) -> dict[int, results_lib.Results]:
  """``{seed: sweep}`` of the folders ``<folder>/s<seed>`` that hold a sweep. A seed's
  sweep may come in parts, ``s<seed>.<part>`` (each a process over some of the recipes, on
  the same checkpoints): they are merged (:func:`fp8jax.study.common.results.merge`).

  Raises:
    FileNotFoundError: no ``s<seed>`` sweep folder in ``folder``.
    ValueError: a seed's parts do not merge (different windows, a recipe defined twice).
  """
  folder = pathlib.Path(folder)
  parts: dict[int, list[results_lib.Results]] = {}
  for sub in sorted(folder.iterdir()) if folder.is_dir() else []:
    m = _SEED_DIR.match(sub.name)
    if m and (sub / "meta.json").exists():
      parts.setdefault(int(m.group(1)), []).append(results_lib.load(sub))
  found = {seed: p[0] if len(p) == 1 else results_lib.merge(p) for seed, p in parts.items()}
  if not found:
    raise FileNotFoundError(f"{folder}: no one-step comparison folders s<seed>/ (compare's "
                            "output on a BF16 run of that seed)")
  return found


def predictor(res: results_lib.Results, policy: str, step: int,
              metric: str = METRIC) -> float:
  """The mean ``metric`` over the finite rows of one policy at one checkpoint (NaN when it
  has none, or when any row is non-finite: such a recipe is not ranked)."""
  rows = res.rows_of(policy, [step])
  if not rows or not all(r["finite"] for r in rows):
    return math.nan
  return float(np.mean([float(r[metric]) for r in rows]))


def agreement(one_step: dict[int | None, results_lib.Results], summary: dict[str, Any],
              metric: str = METRIC, n_boot: int = 2000) -> dict[str, Any]:
  """The rank agreement of the one-step predictor with the full runs' gaps.

  ``one_step``: ``{seed: sweep}``; the seed ``None`` (a sweep on a checkpoint of no run of
  the matrix) is set against each recipe's mean gap over its seeds.
  ``summary``: the validation summary (``recipes[r]["gaps"]`` over ``gap_seeds``). Recipes:
  those of the summary other than BF16 that every sweep compared. Returns ``metric``,
  ``recipes``, ``floor`` (``{step: mean floor rel_err over the seeds}`` when the sweeps
  have one) and ``steps``: ``{step: {"seeds": {seed: {"rho", "p", "n"}}, "mean": Stat as a
  dict (rho over seeds), "of_means": correlate() of the seed means, "x": {recipe: seed-mean
  predictor}, "y": {recipe: mean gap over the same seeds}}}``.
  """
  recipes = [r for r, v in summary["recipes"].items()
             if v.get("verdict") != "reference"
             and all(r in res.policies for res in one_step.values())]
  gap = {r: dict(zip(summary["recipes"][r]["gap_seeds"], summary["recipes"][r]["gaps"]))
         for r in recipes}
  for r in recipes:
    gap[r][None] = float(np.mean(list(gap[r].values()))) if gap[r] else math.nan
  steps = sorted(set.intersection(*(set(res.steps) for res in one_step.values())))
  out = {"metric": metric, "recipes": recipes, "steps": {}, "floor": {}}
  ordered = sorted(one_step.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))
  for step in steps:
    xs = [[predictor(res, r, step, metric) for r in recipes] for _, res in ordered]
    if not np.isfinite(np.array(xs, np.float64)).any():
      continue
    ys = [[gap[r].get(seed, math.nan) for r in recipes] for seed, _ in ordered]
    per_seed = {}
    for (seed, _), x, y in zip(ordered, xs, ys):
      c = correlate(x, y, n_boot=0)
      per_seed[seed] = {"rho": c["rho"], "p": c["p"], "n": c["n"]}
    x_mean, y_mean = _mean_over_seeds(xs), _mean_over_seeds(ys)
    of_means = correlate(x_mean, y_mean, n_boot=n_boot)
    out["steps"][step] = {
        "seeds": per_seed,
        "mean": dataclasses.asdict(fisher_mean([v["rho"] for v in per_seed.values()])),
        "of_means": of_means,
        "x": dict(zip(recipes, x_mean.tolist())),
        "y": dict(zip(recipes, y_mean.tolist()))}
    floors = [f for f in (predictor(res, res.floor, step, metric)
                          for res in one_step.values() if res.floor) if math.isfinite(f)]
    if floors:
      out["floor"][step] = float(np.mean(floors))
  return out


def _mean_over_seeds(rows: list[list[float]]) -> np.ndarray:
  """Column means over the finite values (NaN for a column without one)."""
  a = np.array(rows, np.float64)
  ok = np.isfinite(a)
  n = ok.sum(axis=0)
  return np.where(n > 0, np.where(ok, a, 0.0).sum(axis=0) / np.maximum(n, 1), math.nan)


def fisher_mean(rhos) -> Stat:
  """The mean of correlations with a 95% t-interval, both on Fisher's z = atanh(rho) and
  transformed back (within [-1, 1]); |rho| = 1 is taken as 0.9999."""
  z = [math.atanh(max(-0.9999, min(0.9999, r))) for r in rhos if math.isfinite(r)]
  s = mean_ci(z)
  back = [math.tanh(v) if math.isfinite(v) else math.nan for v in (s.mean, s.lo, s.hi)]
  return Stat(*back, s.n, s.n_nonfinite, len(list(rhos)) - len(z))


def _value(v: float) -> str:
  return "-" if not math.isfinite(v) else f"{v:.4f}"


def _rho(v: float) -> str:
  return "n/a" if not math.isfinite(v) else f"{v:+.2f}"


def markdown(agr: dict[str, Any]) -> list[str]:
  """The agreement as markdown lines: one row per checkpoint step, then the predictor and
  the outcome per recipe at each step."""
  lines = ["Does the one-step comparison rank the recipes as the full runs do? Predictor: "
           f"each recipe's mean one-step {agr['metric']} on checkpoints of the BF16 run of "
           "the same seed; outcome: its full-run gap to BF16. Spearman's rho over "
           "the recipes with a one-step value (n), per seed with its permutation p-value, "
           "the mean over seeds with a 95% t-interval on Fisher's z, and the rho of the seed "
           "means with a bootstrap 95% interval over recipes.", "",
           "| checkpoint step | n | rho per seed (p) | mean rho over seeds | "
           "rho of the seed means |", "|---|---|---|---|---|"]
  for step, s in agr["steps"].items():
    seeds = ", ".join(f"{'mean gap' if k is None else f's{k}'}: {_rho(v['rho'])} "
                      f"({fmt_p(v['p'])})"
                      for k, v in s["seeds"].items())
    n = "/".join(sorted({str(v["n"]) for v in s["seeds"].values()}))
    m = Stat(**s["mean"])
    mean = _rho(m.mean) + (f" [{m.lo:+.2f}, {m.hi:+.2f}]" if m.has_ci else "")
    c = s["of_means"]
    of_means = _rho(c["rho"]) + (f" [{c['lo']:+.2f}, {c['hi']:+.2f}]"
                                 if math.isfinite(c["lo"]) else "") + f", p {fmt_p(c['p'])}"
    lines.append(f"| {step} | {n} | {seeds} | {mean} | {of_means} |")
  steps = list(agr["steps"])
  if steps:
    head = " | ".join(f"one-step {agr['metric']} at {k}" for k in steps)
    lines += ["", f"| recipe | {head} | full-run gap (mean over the same seeds) |",
              "|---|" + "---|" * (len(steps) + 1)]
    for r in agr["recipes"]:
      xs = " | ".join(_value(agr["steps"][k]["x"][r]) for k in steps)
      lines.append(f"| {r} | {xs} | {agr['steps'][steps[0]]['y'][r]:+.2%} |")
    if agr["floor"]:
      xs = " | ".join(_value(agr["floor"].get(k, math.nan)) for k in steps)
      lines.append(f"| (noise floor) | {xs} | - |")
  return lines
