"""FP8 parameter gather under FSDP, simulated (LoongForge's ``--fp8-param-gather``).

With FSDP every device gathers the full weights before each layer runs; LoongForge can
gather them as FP8 (E4M3 payload with 128 x 128 blockwise FP32 scales) instead of BF16,
halving that traffic and the gathered copy's memory. The simulation quantizes the weights
the forward uses: every weight matrix (every params leaf with 2+ dimensions: attention,
MLPs, embedding, head, router; the routed experts' stacks [E, d, f] per expert, as the
blocks span the last two axes) goes through ``fp8jax.fake_quant`` with :data:`SPEC`
before the forward; vectors (the norms) stay as they are. The backward is straight-through:
the gradient of the quantized weight reaches the master weight unchanged.

:func:`memory_estimate` counts the bytes of one full gather of the weights, BF16 vs FP8
(payload, one FP32 scale per block, the vectors still in BF16); the training loop logs it
once at the start (:func:`describe`).
"""

from __future__ import annotations

import math

import jax
import numpy as np

import fp8jax
from fp8jax.models import layer_stack

SPEC = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.block((128, 128)))
"""E4M3, one FP32 scale per 128 x 128 block of the last two axes, current scaling,
straight-through backward (``backward=None``)."""


def quantized(leaf, path=()) -> bool:
  """Whether the params leaf at key path ``path`` is a weight matrix (2+ dimensions per
  layer: the run axis of layers stored stacked does not count) the gather quantizes."""
  return len(leaf.shape) - layer_stack.in_run(path) >= 2


def gather(params, spec: fp8jax.QuantSpec = SPEC):
  """``params`` as the forward sees them after an FP8 gather: every weight matrix
  fake-quantized with ``spec`` (same shapes and dtypes), other leaves unchanged."""
  return jax.tree_util.tree_map_with_path(
      lambda path, p: fp8jax.fake_quant(p, spec) if quantized(p, path) else p, params)


def memory_estimate(params, spec: fp8jax.QuantSpec = SPEC) -> dict:
  """Bytes of one full gather of ``params`` (arrays or ShapeDtypeStructs).

  Returns:
    ``bf16_bytes`` (2 per element), ``fp8_payload_bytes`` (1 per matrix element),
    ``scale_bytes`` (4 per block), ``unquantized_bytes`` (the vectors, 2 per element),
    ``fp8_bytes`` (the sum of the last three) and ``saving_gib`` ((bf16 - fp8) / 2**30).
  """
  out = dict.fromkeys(("bf16_bytes", "fp8_payload_bytes", "scale_bytes",
                       "unquantized_bytes"), 0)
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    size = math.prod(leaf.shape)
    out["bf16_bytes"] += 2 * size
    if quantized(leaf, path):
      out["fp8_payload_bytes"] += size
      out["scale_bytes"] += 4 * int(np.prod(spec.granularity.num_blocks(leaf.shape)))
    else:
      out["unquantized_bytes"] += 2 * size
  out["fp8_bytes"] = out["fp8_payload_bytes"] + out["scale_bytes"] + out["unquantized_bytes"]
  out["saving_gib"] = (out["bf16_bytes"] - out["fp8_bytes"]) / 2**30
  return out


def describe(params) -> str:
  """One log line: the estimate of :func:`memory_estimate` in GiB."""
  m = memory_estimate(params)
  gib = lambda b: f"{b / 2**30:.4g} GiB"  # noqa: E731
  return (f"fp8_param_gather: one full gather of the weights is {gib(m['bf16_bytes'])} in "
          f"BF16, {gib(m['fp8_bytes'])} as FP8 (payload {gib(m['fp8_payload_bytes'])} + FP32 "
          f"scales {gib(m['scale_bytes'])} + BF16 vectors {gib(m['unquantized_bytes'])}): "
          f"saves {m['saving_gib']:.4g} GiB "
          f"({100 * (1 - m['fp8_bytes'] / max(m['bf16_bytes'], 1)):.1f}%)")
