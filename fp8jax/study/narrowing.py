"""The fifth question: how the perturbation grows as the format narrows, per module.

The policies of the ``formats`` grid (:func:`fp8jax.models.policy.formats_grid`) put every
linear layer's GEMMs under one training-precision recipe (``gemm:<recipe>``, see
``fp8jax.gemm.recipes``). They are ordered by element width (8-bit FP8/MXFP8, then 4-bit
MXFP4/NVFP4) and compared per module on the relative gradient error pooled over the
checkpoints and batches; the growth of a module is the ratio of its mean error under the
4-bit recipes to the mean under the 8-bit ones.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from fp8jax.gemm import recipes
from fp8jax.study.results import Results
from fp8jax.study.stats import Stat, fmt, fmt_stat, stat

_RECIPE = re.compile(r"^gemm:([a-z0-9_]+)$")
_MODULE_METRIC = re.compile(r"^module/([^/]+)/rel_err$")


def format_policies(res: Results) -> list[dict[str, Any]]:
  """The sweep's single-recipe policies, widest element format first:
  ``[{"policy", "recipe", "bits"}]``."""
  found = []
  for p in res.policies:
    m = _RECIPE.match(str(res.meta["policies"][p].get("expr", "")).strip())
    if m and m.group(1) in recipes.RECIPES:
      cfg = recipes.RECIPES[m.group(1)]
      bits = max(cfg.roles.spec(r).fmt.bits for r in ("input", "weight", "grad"))
      found.append({"policy": p, "recipe": m.group(1), "bits": bits})
  order = list(recipes.RECIPES)
  return sorted(found, key=lambda f: (-f["bits"], order.index(f["recipe"])))


def modules(res: Results, policies: list[str]) -> list[str]:
  """The modules with a per-module rel_err column in the rows of ``policies``."""
  names = {m.group(1) for p in policies for r in res.rows_of(p)
           for k in r if (m := _MODULE_METRIC.match(k))}
  return sorted(names)


def _mean(stats: list[Stat]) -> float:
  v = [s.mean for s in stats if math.isfinite(s.mean)]
  return float(np.mean(v)) if v else math.nan


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
  overall = {p: stat(res, "rel_err", p) for p in names}
  rows = []
  for mod in modules(res, names):
    per = {p: stat(res, f"module/{mod}/rel_err", p) for p in names}
    w, n = _mean([per[p] for p in wide]), _mean([per[p] for p in narrow])
    ordered = all(per[a].mean < per[b].mean for a in wide for b in narrow
                  if math.isfinite(per[a].mean) and math.isfinite(per[b].mean))
    rows.append({"module": mod, "per_policy": per, "wide": w, "narrow": n,
                 "growth": n / w if w > 0 else math.nan, "ordered": ordered})
  growth = [r for r in rows if math.isfinite(r["growth"])]
  text = ("Relative gradient error, pooled: " + ", ".join(
      f"{p} {fmt(overall[p].mean)}" for p in names))
  if growth:
    top = max(growth, key=lambda r: r["growth"])
    low = min(growth, key=lambda r: r["growth"])
    n_ord = sum(r["ordered"] for r in rows)
    text += (f". From the 8-bit to the 4-bit recipes the error grows by a factor "
             f"{fmt(low['growth'])} ({low['module']}) to {fmt(top['growth'])} "
             f"({top['module']}) across {len(growth)} modules (median "
             f"{fmt(float(np.median([r['growth'] for r in growth])))}); every 4-bit recipe "
             f"is above every 8-bit one in {n_ord} of {len(rows)} modules")
  return {"available": True, "policies": pols, "overall": overall, "modules": rows,
          "settings": rows, "summary": text + "."}


def markdown(a: dict[str, Any]) -> list[str]:
  """The answer's tables: pooled error per recipe, then per module."""
  names = [f["policy"] for f in a["policies"]]
  lines = ["| recipe | element bits | rel_err |", "|---|---|---|"]
  lines += [f"| {f['policy']} (`{f['recipe']}`) | {f['bits']} | "
            f"{fmt_stat(a['overall'][f['policy']])} |" for f in a["policies"]]
  lines += ["", "| module | " + " | ".join(names) + " | 4-bit / 8-bit | ordered |",
            "|" + "---|" * (len(names) + 3)]
  for r in a["modules"]:
    cells = [fmt(r["per_policy"][p].mean) for p in names]
    lines.append(f"| {r['module']} | " + " | ".join(cells)
                 + f" | {fmt(r['growth'])} | {'yes' if r['ordered'] else 'no'} |")
  return lines + [""]


__all__ = ["format_policies", "markdown", "modules", "narrowing_answer"]
