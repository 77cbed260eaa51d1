"""The fifth question: how the perturbation grows as the format narrows, per module.

The policies of the ``formats`` grid (:func:`fp8jax.study.comparison.policies.formats_grid`)
put every linear layer's GEMMs under one training-precision recipe (``gemm:<recipe>``, see
``fp8jax.gemm.recipes``): their records (:meth:`~fp8jax.study.common.results.Results.record`)
name the recipe and its element width, whatever the policies are called. They are ordered
by element width (8-bit FP8/MXFP8, then 4-bit MXFP4/NVFP4) and compared per module on the
relative gradient error: the median over the checkpoints of its geometric mean over the
batches, with a bootstrap 95% interval (:func:`fp8jax.study.common.stats.overall`); the
growth of a module is the ratio of the geometric mean of these medians under the 4-bit
recipes to that under the 8-bit ones.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from fp8jax.gemm import recipes
from fp8jax.study.common.results import Results
from fp8jax.study.common.stats import Summary, fmt, fmt_stat, overall

_MODULE_METRIC = re.compile(r"^module/([^/]+)/rel_err$")


def format_policies(res: Results) -> list[dict[str, Any]]:
  """The sweep's single-recipe policies (a named recipe on every linear layer, no site
  rule: from each record's ``gemm``), widest element format first:
  ``[{"policy", "recipe", "bits"}]``."""
  found = []
  for p in res.policies:
    record = res.record(p)
    gemm = record["gemm"]
    if (gemm is None or record["sites"] or gemm["layers"] is not None
        or gemm["where"] not in (None, ".*") or gemm["recipe"] not in recipes.RECIPES):
      continue
    found.append({"policy": p, "recipe": gemm["recipe"], "bits": gemm["bits"]})
  order = list(recipes.RECIPES)
  return sorted(found, key=lambda f: (-f["bits"], order.index(f["recipe"])))


def modules(res: Results, policies: list[str]) -> list[str]:
  """The modules with a per-module rel_err column in the rows of ``policies``."""
  names = {m.group(1) for p in policies for r in res.rows_of(p)
           for k in r if (m := _MODULE_METRIC.match(k))}
  return sorted(names)


def _geomean(stats: list[Summary]) -> float:
  v = [s.center for s in stats if math.isfinite(s.center) and s.center > 0]
  return float(np.exp(np.mean(np.log(v)))) if v else math.nan


def narrowing_answer(res: Results) -> dict[str, Any]:
  """(5) Per-module relative gradient error of each recipe and the 4-bit / 8-bit growth."""
  pols = format_policies(res)
  wide = [f["policy"] for f in pols if f["bits"] == 8]
  narrow = [f["policy"] for f in pols if f["bits"] < 8]
  if not (wide and narrow):
    return {"available": False, "settings": [],
            "summary": "Not available: the grid lacks an 8-bit and a 4-bit GEMM recipe "
                       "(run the `formats` grid)."}
  names = [f["policy"] for f in pols]
  total = {p: overall(res, "rel_err", p) for p in names}
  rows = []
  for mod in modules(res, names):
    per = {p: overall(res, f"module/{mod}/rel_err", p) for p in names}
    w, n = _geomean([per[p] for p in wide]), _geomean([per[p] for p in narrow])
    ordered = all(per[a].center < per[b].center for a in wide for b in narrow
                  if math.isfinite(per[a].center) and math.isfinite(per[b].center))
    rows.append({"module": mod, "per_policy": per, "wide": w, "narrow": n,
                 "growth": n / w if w > 0 else math.nan, "ordered": ordered})
  growth = [r for r in rows if math.isfinite(r["growth"])]
  text = ("Relative gradient error, median over the checkpoints: " + ", ".join(
      f"{p} {fmt(total[p].center)}" for p in names))
  if growth:
    top = max(growth, key=lambda r: r["growth"])
    low = min(growth, key=lambda r: r["growth"])
    n_ord = sum(r["ordered"] for r in rows)
    text += (f". From the 8-bit to the 4-bit recipes the error grows by a factor "
             f"{fmt(low['growth'])} ({low['module']}) to {fmt(top['growth'])} "
             f"({top['module']}) across {len(growth)} modules (median "
             f"{fmt(float(np.median([r['growth'] for r in growth])))}); every 4-bit recipe "
             f"is above every 8-bit one in {n_ord} of {len(rows)} modules")
  return {"available": True, "policies": pols, "overall": total, "modules": rows,
          "settings": rows, "summary": text + "."}


def markdown(a: dict[str, Any]) -> list[str]:
  """The answer's tables: the error per recipe, then per module."""
  names = [f["policy"] for f in a["policies"]]
  lines = ["| recipe | element bits | rel_err |", "|---|---|---|"]
  lines += [f"| {f['policy']} (`{f['recipe']}`) | {f['bits']} | "
            f"{fmt_stat(a['overall'][f['policy']])} |" for f in a["policies"]]
  lines += ["", "| module | " + " | ".join(names) + " | 4-bit / 8-bit | ordered |",
            "|" + "---|" * (len(names) + 3)]
  for r in a["modules"]:
    cells = [fmt(r["per_policy"][p].center) for p in names]
    lines.append(f"| {r['module']} | " + " | ".join(cells)
                 + f" | {fmt(r['growth'])} | {'yes' if r['ordered'] else 'no'} |")
  return lines + [""]


__all__ = ["format_policies", "markdown", "modules", "narrowing_answer"]
