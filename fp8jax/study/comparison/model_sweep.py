"""The comparison sweep on any model, from params and batches in memory.

    model, params = model_api.nnx_model(my_model, classifier)
    evaluate(model, "out/compare", [Variant("mlp_fp8", rules)], {0: params}, batches)
    report.write_report("out/compare")

:func:`evaluate` is :func:`fp8jax.study.comparison.sweep.evaluate` over params in memory
(:class:`~fp8jax.study.comparison.checkpoint_source.InMemory`): it takes a
:class:`~fp8jax.models.api.Model`, its params per step and the evaluation batches directly,
and writes the folder a sweep over a training run writes (``meta.json``, ``rows.jsonl``,
``details.jsonl``, ``baseline.jsonl``, ``weights.jsonl``; ``meta.json``'s ``reference``:
the precision the model's baseline computes in, read from the model), so the report reads
it unchanged and names the reference by that precision. It resumes like the sweep:
finished rows are skipped. One process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from fp8jax.models import api
from fp8jax.study.comparison import checkpoint_source
from fp8jax.study.comparison import sweep as sweep_lib


def _batches(batches) -> dict[tuple[int, int], Any]:
  """``{(offset, index): batch}``, sorted, of a list (offset 0) or such a dict."""
  if isinstance(batches, Mapping):
    return {(int(o), int(b)): batches[(o, b)] for o, b in sorted(batches)}
  out = {(0, i): b for i, b in enumerate(batches)}
  if not out:
    raise ValueError("batches: give at least one evaluation batch")
  return out


def _windows(batches: Mapping[tuple[int, int], Any]) -> dict:
  """``meta.json``'s ``windows`` of ``{(offset, index): batch}``: offsets, batches per
  offset, batch size and sequence length (0: batches of one axis)."""
  first = jax.tree.leaves(next(iter(batches.values())))[0]
  return {"offsets": sorted({o for o, _ in batches}),
          "batches": max(b for _, b in batches) + 1, "batch_size": int(np.shape(first)[0]),
          "seq_len": int(np.shape(first)[1]) if np.ndim(first) > 1 else 0,
          "seed": None, "split": ""}


def evaluate(model: api.Model, out, policies: Sequence[Any],
             params: Mapping[int, Any] | Any, batches, *, devices=None, floor: bool = True,
             floor_seed: int = 0, telemetry: bool = False, data: str = "in memory",
             delayed_warmup: int = sweep_lib.DELAYED_WARMUP, stream=None) -> dict:
  """Writes (or completes) a sweep folder of ``model`` under ``policies``.

  Args:
    model: the model (:mod:`fp8jax.models.registry`, or
      :mod:`fp8jax.study.comparison.model_api` for a Flax model of your own).
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
    delayed_warmup: warm-up passes of a delayed-scaling policy over the batches of each
      offset (:func:`fp8jax.study.comparison.sweep.evaluate`).

  Returns:
    ``rows_written``, ``out`` and ``skipped`` (none here).
  """
  batches = _batches(batches)
  info = {"model": {"name": model.name, **dict(model.meta)}, "windows": _windows(batches),
          "data": data}
  return sweep_lib.evaluate(model, checkpoint_source.InMemory(params), batches, out,
                            list(policies), info=info, devices=devices, floor=floor,
                            floor_seed=floor_seed, telemetry=telemetry,
                            delayed_warmup=delayed_warmup, stream=stream)
