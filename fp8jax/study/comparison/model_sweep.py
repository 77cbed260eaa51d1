"""The comparison sweep on any model, from params and batches in memory.

    model, params = model_api.nnx_model(my_model, classifier)
    evaluate(model, "out/compare", [Variant("mlp_fp8", rules)], {0: params}, batches)
    report.write_report("out/compare")

:func:`fp8jax.study.comparison.sweep.run` reads DeepSeek-MoE checkpoints and the training data;
:func:`evaluate` takes a :class:`~fp8jax.study.comparison.model_api.StudyModel`, its params per step
and the evaluation batches directly, and writes the same folder (``meta.json``,
``rows.jsonl``, ``details.jsonl``, ``baseline.jsonl``, ``weights.jsonl``; ``meta.json``'s
``reference``: the precision the model's baseline computes in, read from the model), so the
report reads it unchanged and names the reference by that precision. It resumes like the
sweep: finished rows are skipped. One process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import pathlib
import sys
from typing import Any

import jax
import numpy as np

from fp8jax import metrics
from fp8jax.study.common import noise_floor
from fp8jax.study.comparison import model_api, paired
from fp8jax.study.comparison import sweep as sweep_lib
from fp8jax.train import mesh as mesh_lib
from fp8jax.train import metrics_log


def _batches(batches) -> dict[tuple[int, int], Any]:
  """``{(offset, index): batch}`` of a list (offset 0) or such a dict."""
  if isinstance(batches, Mapping):
    return {(int(o), int(b)): v for (o, b), v in batches.items()}
  out = {(0, i): b for i, b in enumerate(batches)}
  if not out:
    raise ValueError("batches: give at least one evaluation batch")
  return out


def evaluate(model: model_api.StudyModel, out, policies: Sequence[Any],
             params: Mapping[int, Any] | Any, batches, *, devices=None, floor: bool = True,
             floor_seed: int = 0, telemetry: bool = False, data: str = "in memory",
             stream=None) -> dict:
  """Writes (or completes) a sweep folder of ``model`` under ``policies``.

  Args:
    model: the model (:mod:`fp8jax.study.comparison.model_api`).
    out: the results folder.
    policies: what ``model.apply`` takes (for a rules model, :class:`model_api.Variant` s),
      with distinct ``name`` s.
    params: ``{step: params}`` (checkpoints), or one params tree (step 0).
    batches: evaluation batches (each a pytree of arrays with the batch on axis 0, e.g.
      int32 tokens [B, S]): a list (offset 0) or ``{(offset, index): batch}``.
    devices: the data mesh's devices (default: all).
    floor: also write the noise floor rows (:mod:`fp8jax.study.common.noise_floor`).
    telemetry: record the GEMM operand telemetry (DeepSeek-MoE only).
    data: the data's description in ``meta.json``.

  Returns:
    ``rows_written`` and ``out``.
  """
  stream = stream or sys.stderr
  by_step = dict(params) if isinstance(params, Mapping) and all(
      isinstance(k, int) for k in params) else {0: params}
  batches = _batches(batches)
  first = jax.tree.leaves(next(iter(batches.values())))[0]
  offsets = sorted({o for o, _ in batches})
  mesh = mesh_lib.data_mesh(devices)
  mesh_lib.check_global_batch(int(np.shape(first)[0]), mesh)
  evaluator = paired.PairedEvaluator(model, list(policies), mesh, telemetry=telemetry)
  meta = {"train_workdir": "", "model": {"name": model.name, **dict(model.meta)},
          "policies": {p.name: model.policy_meta(p) for p in policies},
          "steps": sorted(by_step), "data": data,
          "windows": {"offsets": offsets, "batches": max(b for _, b in batches) + 1,
                      "batch_size": int(np.shape(first)[0]),
                      "seq_len": int(np.shape(first)[1]) if np.ndim(first) > 1 else 0,
                      "seed": None, "split": ""},
          "classes": model.classifier.to_table(metrics.flatten(model.abstract_params())),
          "reference": model.reference_precision(next(iter(batches.values())))}
  if floor:
    meta["policies"][noise_floor.FLOOR] = {
        "expr": noise_floor.FLOOR, "direct": [], "kind": "floor",
        "scale": noise_floor.BF16_UNIT_ROUNDOFF, "seed": floor_seed}
  names = [p.name for p in policies] + ([noise_floor.FLOOR] if floor else [])
  output = sweep_lib._Output(pathlib.Path(out), meta)  # pylint: disable=protected-access
  sharding = mesh_lib.batch_sharding(mesh)
  norms = jax.jit(lambda p: metrics.weights.norms_by_module(p, model.classifier))
  progress = metrics_log.Progress(len(by_step) * len(batches), 0, stream, prefix="compare")
  first = metrics_log.FirstCalls("compare", stream, total=1 + len(names))
  written, i = 0, 0
  for step, step_params in sorted(by_step.items()):
    if step not in output.weights:
      output.append("weights.jsonl", {"step": step, **{
          f"weight_norm/{k}": float(v) for k, v in jax.device_get(norms(step_params)).items()}})
    for key, batch in sorted(batches.items()):
      i += 1
      todo = [n for n in names if (step, *key, n) not in output.rows]
      if (step, *key) in output.base_nonfinite or not todo:
        continue
      placed = jax.tree.map(lambda x: jax.device_put(x, sharding), batch)
      written += sweep_lib._evaluate(  # pylint: disable=protected-access
          evaluator, output, todo, step, key, step_params, placed,
          dict.fromkeys(todo), floor_seed, first)
      progress.message(i, f"step {step}, offset {key[0]} batch {key[1]}: {len(todo)} rows")
  return {"rows_written": written, "out": str(out)}
