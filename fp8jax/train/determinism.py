"""The deterministic mode: the same program on the same inputs gives the same bits on a GPU.

On a CPU, XLA's programs are deterministic. On a GPU, by default, the model's gradient is
not: measured on an H100 (docs/determinism.md), the BF16 gradient of a DeepSeek-MoE layer
at the 2B widths differs between two calls of the same compiled step in one place, the
embedding table's gradient, a scatter-add whose atomics add the rows of a repeated token in
whatever order the threads arrive (with ``moe_impl="dispatch"`` also the routed experts'
weights, whose grouped GEMM gathers one weight per row tile: its gradient is a
scatter-add too). Every other parameter's gradient was bit-identical (attention through
cuDNN, the Pallas and Mosaic GPU grouped GEMMs, XLA's reductions and GEMMs). After 100
steps at the 2B widths two runs then end 4% apart in loss, which a BF16-vs-FP8 comparison
would mix with the recipe.

The mode (``train.deterministic`` in a run config, ``deterministic=`` in the library,
``--deterministic`` for the comparison binaries) removes each source:

- the embedding table's gradient is a one-hot GEMM (:mod:`fp8jax.models.embedding`);
- attention runs through XLA instead of cuDNN: cuDNN's flash-attention backward adds the
  query gradient with atomics (seen on the H100: after 50 steps only ``q_proj`` and its
  moments differed between two runs of one executable);
- XLA's autotuner is off (:func:`enable`: ``--xla_gpu_autotune_level=0``), so every
  compilation picks the same kernels by its heuristics: two compilations of the same step
  then gave different bits from the third step on with autotuning, the same bits without;
- on a GPU the routed experts should run on the kernels (``moe_impl="pallas"``, the 2B
  configs' choice): XLA's grouped GEMM takes its weight gradient by a scatter-add.

The first two are static options of the traced functions; the third is a process-wide XLA
flag, read when JAX starts its backends, so :func:`enable` must run before the process's
first computation (the binaries and :func:`fp8jax.train.loop.train` call it first).

XLA's own switch, ``--xla_gpu_deterministic_ops=true`` (or
``--xla_gpu_exclude_nondeterministic_ops=true``), was tried first: on jax 0.11.2 with CUDA
13 the 2-layer training step then fails at its first execution with ``IndexError:
absl::container_internal::raw_hash_map<>::at``, with or without command buffers, the
Pallas kernels or cuDNN attention (``scripts/gpu/det_variants.sh``), while a single-layer
gradient runs. The mode therefore does not set it.
"""

from __future__ import annotations

import os
import warnings

FLAG = "--xla_gpu_autotune_level=0"
"""The XLA flag of the deterministic mode: no autotuning, the same kernels every time."""


def _backends_started() -> bool:
  """Whether JAX has started its backends (XLA has then read ``XLA_FLAGS``)."""
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  return bool(getattr(xla_bridge, "_backends", None))


def enable() -> None:
  """Adds :data:`FLAG` to ``XLA_FLAGS`` for this process. Once JAX has started its
  backends it is too late: then, on a GPU, a warning says so (autotuning may pick other
  kernels in another compilation; set ``XLA_FLAGS`` before the first computation)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if FLAG in flags.split():
    return
  if not _backends_started():
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
    return
  import jax  # pylint: disable=import-outside-toplevel
  if jax.default_backend() == "gpu":
    warnings.warn(f"the deterministic mode could not set XLA_FLAGS={FLAG}: JAX already "
                  "started its backends, so another compilation may autotune other kernels; "
                  "set it before the first computation of the process", stacklevel=2)


def set_mode(deterministic: bool) -> dict:
  """Sets the GPU mode (:func:`enable`: its XLA flag, when on) and returns its record, the
  dict that a run's or a sweep's metadata keep."""
  if deterministic:
    enable()
  return {"deterministic": bool(deterministic)}


def mode_of(config: dict) -> str:
  """"deterministic" or "default": the GPU mode a run's saved config (a dict) recorded."""
  return "deterministic" if (config.get("train") or {}).get("deterministic") else "default"
