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

The mode (``train.deterministic`` in a run config, ``deterministic=`` in the library)
computes the embedding table's gradient as a one-hot GEMM (:mod:`fp8jax.models.embedding`)
and keeps the grouped GEMM on the kernels (``moe_impl="pallas"`` on a GPU). It is a
static option of the traced functions, so it needs no process-wide setting and can be
mixed in one process.

XLA's own flag for this, ``--xla_gpu_deterministic_ops=true`` (and
``--xla_gpu_exclude_nondeterministic_ops=true``), was tried first: on jax 0.11.2 with CUDA
13 the training step then fails at its first execution with ``IndexError:
absl::container_internal::raw_hash_map<>::at``, with or without command buffers, the
Pallas kernels or cuDNN attention (``scripts/gpu/det_variants.sh``), while a single-layer
gradient runs. The mode therefore does not set it.
"""

from __future__ import annotations


def record(deterministic: bool) -> dict:
  """The mode as a run or a sweep records it."""
  return {"deterministic": bool(deterministic)}
