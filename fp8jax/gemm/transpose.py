"""Producing a quantized operand in the transposed layout a backward GEMM needs.

A tensor quantized for one GEMM (say X with 1x128 tiles along K for the forward pass)
is needed transposed by another (X^T with tiles along M for the weight gradient).
Three ways to get it, after FP8-Flow-MoE (arXiv 2511.02302):

``requant``
  quantize the saved high-precision original, transposed: one rounding, but the
  high-precision tensor must be kept.
``double``
  dequantize the FP8 tensor (in float32) and quantize the transpose again: a second
  rounding ("double quantization").
``scaling_aware``
  re-express the FP8 payload with the new blocks' scales: each new block takes the
  largest ``scale_inv`` of the old blocks it overlaps and every payload element is
  multiplied by ``old_scale_inv / new_scale_inv`` and cast. With power-of-two scales
  that factor is a power of two <= 1, so the result is exact except where it underflows;
  with FP32 scales it rounds.
"""

from __future__ import annotations

import dataclasses

import jax
from jax import lax
import jax.numpy as jnp
import ml_dtypes

from fp8jax.numerics import arguments, blocks, formats
from fp8jax.numerics import spec as spec_lib
from fp8jax.quant import qtensor

POLICIES = ("requant", "double", "scaling_aware")


def _swap(x: jax.Array) -> jax.Array:
  return jnp.swapaxes(x, -1, -2)


def transposed(x_hp: jax.Array | None, qt: qtensor.QTensor, spec: spec_lib.QuantSpec,
               policy: str, key: jax.Array | None = None) -> qtensor.QTensor:
  """The quantization of ``swapaxes(x, -1, -2)`` with ``spec``, made by ``policy``.

  Args:
    x_hp: the high-precision original [..., R, C] (needed by "requant" only).
    qt: ``x`` as quantized for the first GEMM.
    spec: spec for the transposed tensor [..., C, R].
    policy: "requant", "double" or "scaling_aware".
    key: PRNG key for a stochastic-rounding ``spec`` (requant and double).

  Returns:
    A QTensor of shape [..., C, R].
  """
  if not isinstance(qt, qtensor.QTensor):
    raise TypeError(f"transposed: qt must be a QTensor, got {type(qt).__name__}")
  spec = arguments.quant_spec(spec, "spec", "transposed")
  if policy == "requant":
    if x_hp is None:
      raise ValueError("the requant transpose policy needs the high-precision tensor")
    return quantize_swapped(x_hp, spec, key)
  if policy == "double":
    return quantize_swapped(qtensor.dequantize(qt, jnp.float32), spec, key)
  if policy == "scaling_aware":
    return scaling_aware_transpose(qt, spec)
  raise ValueError(f"unknown transpose policy {policy!r}; choose one of {POLICIES}")


def quantize_swapped(x: jax.Array, spec: spec_lib.QuantSpec,
                     key: jax.Array | None = None) -> qtensor.QTensor:
  """``qtensor.quantize(swapaxes(x, -1, -2), spec)``, with the block amax reduced on x's
  own layout and materialized first: fused into the transposition, XLA:GPU reduces
  along the strided axis, several times slower than a transpose
  (docs/performance/archive/2026-11-24_gemm_pair_within_2x.md). Equal bit for bit (a
  maximum is exact)."""
  xt = _swap(x)
  block = spec.granularity.block_shape(xt.shape)
  amax = blocks.block_amax(x, (*block[:-2], block[-1], block[-2]))
  return qtensor.quantize(xt, spec, key=key, amax=lax.optimization_barrier(_swap(amax)))


def quantize_columns(x: jax.Array, spec: spec_lib.QuantSpec) -> qtensor.QTensor:
  """:func:`quantize_swapped` left in ``x``'s own layout, for a GEMM that reads its operand
  contraction-first: payload [..., R, C] and ``scale_inv`` per block of ``spec``'s blocks
  with the last two axes exchanged (1 x 128 tiles of the transpose are 128 x 1 blocks of
  ``x``). Equal bit for bit to ``swapaxes`` of :func:`quantize_swapped`'s payload and
  scales (the same blocks, amax and casts), with no transposition at all. Round to
  nearest only: stochastic rounding draws its bits in the layout it quantizes."""
  if spec.rounding != "nearest":
    raise ValueError(f"quantize_columns rounds to nearest only, got {spec.describe()}")
  gran = spec.granularity
  axes = tuple({-1: -2, -2: -1}.get(a - x.ndim if a >= 0 else a, a) for a in gran.axes)
  return qtensor.quantize(x, spec.replace(granularity=dataclasses.replace(gran, axes=axes)))


def scaling_aware_transpose(qt: qtensor.QTensor, spec: spec_lib.QuantSpec) -> qtensor.QTensor:
  """Transposes ``qt`` into ``spec``'s blocks without going through the amax again."""
  if spec.scaling != "current":
    raise ValueError("the scaling-aware transpose needs a current-scaling target spec")
  if spec.two_level or qt.tensor_scale_inv is not None or \
      spec.rounding != "nearest" or not spec.fmt.has_nan:
    raise ValueError(
        "the scaling-aware transpose handles one-level scales, round-to-nearest and "
        f"formats with a NaN code; got {spec.describe()} (use requant or double)")
  old_inv = blocks.broadcast_blocks(qt.scale_inv.astype(jnp.float32), qt.full_block,
                                    qt.shape)
  old_inv = _swap(old_inv)
  data = _swap(qtensor.payload_f32(qt.data))
  new_block = spec.granularity.block_shape(data.shape)
  new_inv = blocks.block_amax(old_inv, new_block)  # largest old scale_inv per new block
  new_inv = jnp.where(jnp.isinf(new_inv), jnp.float32(jnp.nan), new_inv)  # NaN blocks stay
  ratio = old_inv / blocks.broadcast_blocks(new_inv, new_block, data.shape)
  payload = formats.saturating_cast(data * ratio, spec.fmt)
  stored = new_inv.astype(ml_dtypes.float8_e8m0fnu) if spec.store_e8m0 else new_inv
  return qtensor.QTensor(payload, stored, new_block, qt.dtype)
