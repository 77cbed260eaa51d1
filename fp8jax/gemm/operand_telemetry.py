"""Per-block scale telemetry of a GEMM recipe's operands (pure JAX, jittable).

For one operand in the contraction-last layout the GEMM quantizes it in (X [..., K] with
the input role's spec, W^T [N, K] or [E, N, K] with the weight role's), :func:`operand_sums`
returns additive sums over its scale blocks, so that operands (and experts) combine by
addition and :func:`summarize` turns any total into the recorded statistics:

- ``saturated_frac``: the share of blocks with an element that the saturating cast clips
  (possible with power-of-two scale rules and delayed scaling);
- ``underflow_frac``: the share of blocks with a nonzero finite element flushed to zero;
- ``zero_block_frac``: the share of all-zero blocks (their scale is arbitrary);
- ``four_frac`` / ``oas_raised_frac``: of the nonzero finite blocks quantized with Four
  Over Six (OAS), the share scaled to 4 (whose scale OAS raised a binade above OCP's);
  NaN where no operand uses the rule (:data:`fp8jax.quant.telemetry.SCALE_RULE_STATS`);
- ``scale_subnormal_frac`` / ``scale_zero_frac``: two-level (NVFP4) scales only, the share
  of blocks with a finite nonzero amax whose block scale is subnormal in its format (E4M3
  below 2**-6, UE5M3 below 2**-14: fewer significant bits) or rounds to 0 (the block
  dequantizes to zeros), next to the tensor's (row's) largest block;
- ``scale_log2_p05`` / ``p50`` / ``p95``: quantiles of ``floor(log2)`` of the blocks'
  effective dequantization scale (``scale_inv``, times the tensor level of two-level NVFP4
  scales), over the nonzero blocks;
- ``kurtosis``: ``E[q^4] / E[q^2]^2`` of the dequantized operand ``q`` (3 for a Gaussian;
  large for outlier-heavy activations), over its finite elements.

The sums are taken on ``stop_gradient`` of the operand: recording them changes no
gradient. Telemetry describes the format's own quantization, also for a noise control.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.numerics import blocks, scales
from fp8jax.numerics import spec as spec_lib
from fp8jax.quant import qtensor
from fp8jax.quant import telemetry as telemetry_lib

LOG2_LOW, LOG2_BINS = -160, 320
"""The log2-scale histogram covers floor(log2 scale) in [LOG2_LOW, LOG2_LOW + LOG2_BINS)."""

RULE_COUNTS = tuple(f"{r.name}{part}_blocks" for r in telemetry_lib.SCALE_RULE_STATS
                    for part in ("", "_rule"))
"""The additive sums of the scale rules' choices (part of :data:`COUNTS`)."""
COUNTS = ("blocks", "saturated_blocks", "underflow_blocks", "zero_blocks", "elements",
          "sum_q2", "sum_q4", "kurtosis_sum", "operands", "scale_subnormal_blocks",
          "scale_zero_blocks", *RULE_COUNTS)
"""The additive scalar sums of :func:`operand_sums` (float32); plus ``log2_hist``."""


def _histogram(bins: jax.Array) -> jax.Array:
  """float32 [LOG2_BINS] counts of the int32 ``bins`` in [0, LOG2_BINS) (others ignored).

  By comparing every bin with every entry in one reduction (exact int32 counts). On a GPU a
  scatter-add serializes its atomic adds to the few bins an operand's blocks fall in, and a
  sort with a search of the bin edges is a loop of small kernels. Its work, LOG2_BINS
  compares per entry, is one fused pass, the fastest of the three at the 2B shapes
  (docs/performance/archive/2026-11-26_pair_fusions_wgrad.md,
  docs/performance/archive/2026-11-26_pair_expert_weights_one_read.md)."""
  edges = jnp.arange(LOG2_BINS, dtype=bins.dtype)
  return jnp.sum(bins.reshape(1, -1) == edges[:, None], axis=1, dtype=jnp.int32).astype(
      jnp.float32)


def block_stats(x: jax.Array, spec: spec_lib.QuantSpec):
  """``x`` quantized with ``spec`` and per-block statistics of that quantization.

  Returns:
    ``(qt, stats)``: the QTensor and a dict of float32 arrays shaped like its
    ``scale_inv`` (one entry per block), named as
    :data:`fp8jax.kernels.block_quant_pallas.STATS` (which computes the same in one read):
    ``amax``, ``saturated`` (0/1), ``flushed`` (0/1), ``finite`` (count), ``sum_q2`` and
    ``sum_q4`` (of the dequantized block, non-finite values as 0); for two-level specs
    also ``scale_subnormal`` and ``scale_zero`` (0/1, see the module docstring), and the
    0/1 arrays of the scale rules the spec uses
    (:func:`fp8jax.quant.telemetry.scale_rule_blocks`).
  """
  x = lax.stop_gradient(x)
  spec = spec.replace(noise_control=False)
  qt, scaled, _ = qtensor.quantize_with_scaled(x, spec)
  block = qt.full_block
  f32 = jnp.float32
  sat = telemetry_lib.saturates(jnp.abs(scaled), spec.fmt).astype(f32)
  live = jnp.isfinite(x) & (x != 0)
  flushed = (live & (qtensor.payload_f32(qt.data) == 0)).astype(f32)
  q = qtensor.dequantize(qt, f32)
  q2 = jnp.square(jnp.where(jnp.isfinite(q), q, 0.0))
  any_of = lambda v: (blocks.block_sum(v, block) > 0).astype(f32)  # noqa: E731
  amax = blocks.block_amax(x, block)
  stats = {"amax": amax, "saturated": any_of(sat), "flushed": any_of(flushed),
           "finite": blocks.block_sum(jnp.isfinite(x), block),
           "sum_q2": blocks.block_sum(q2, block), "sum_q4": blocks.block_sum(q2 * q2, block)}
  if spec.two_level:  # the block scales below their format's normals, or 0
    sc, live_block = qt.scale_inv.astype(f32), (amax > 0) & jnp.isfinite(amax)
    tiny = jnp.float32(scales.block_scale_min_normal(spec))
    stats["scale_subnormal"] = (live_block & (sc > 0) & (sc < tiny)).astype(f32)
    stats["scale_zero"] = (live_block & (sc == 0)).astype(f32)
  stats.update(telemetry_lib.scale_rule_blocks(x, qt, spec, amax))  # 4/6, OAS: where used
  return qt, stats


def sums_of_blocks(qt: qtensor.QTensor, stats: dict[str, jax.Array],
                   experts: bool = False) -> dict[str, jax.Array]:
  """The additive sums (:data:`COUNTS` and ``log2_hist``) of one operand from its
  per-block ``stats`` (:func:`block_stats`) and quantization ``qt``. ``experts``: the
  leading axis stacks experts, each a tensor of its own (kurtosis per expert, averaged;
  ``operands`` counts one)."""
  f32 = jnp.float32
  amax = stats["amax"]
  scale = qt.scale_inv.astype(f32)
  if qt.tensor_scale_inv is not None:
    tensor = qt.tensor_scale_inv
    scale = scale * (tensor.reshape(tensor.shape + (1,) * (scale.ndim - tensor.ndim))
                     if experts else tensor)
  nonzero = (amax > 0) & jnp.isfinite(amax) & jnp.isfinite(scale)  # NaN/inf blocks: apart
  bins = jnp.clip(jnp.floor(jnp.log2(jnp.where(nonzero, scale, 1.0))) - LOG2_LOW, 0,
                  LOG2_BINS - 1).astype(jnp.int32)
  hist = _histogram(jnp.where(nonzero, bins, LOG2_BINS).ravel())
  axes = tuple(range(1 if experts else 0, amax.ndim))
  n = jnp.sum(stats["finite"], axis=axes)
  q2, q4 = jnp.sum(stats["sum_q2"], axis=axes), jnp.sum(stats["sum_q4"], axis=axes)
  kurtosis = jnp.mean(jnp.where(q2 > 0, n * q4 / jnp.where(q2 > 0, q2 * q2, 1.0), 0.0))
  return {"blocks": f32(amax.size),
          "saturated_blocks": jnp.sum(stats["saturated"] > 0, dtype=f32),
          "underflow_blocks": jnp.sum(stats["flushed"] > 0, dtype=f32),
          "zero_blocks": jnp.sum(amax == 0, dtype=f32), "elements": jnp.sum(n),
          "sum_q2": jnp.sum(q2), "sum_q4": jnp.sum(q4), "kurtosis_sum": kurtosis,
          "operands": f32(1), "log2_hist": hist,
          **{c: _count(stats, c.removesuffix("_blocks"))
             for c in ("scale_subnormal_blocks", "scale_zero_blocks", *RULE_COUNTS)}}


def _count(stats: dict[str, jax.Array], key: str) -> jax.Array:
  """The blocks marked in the 0/1 ``stats[key]`` (0 where the operand has none)."""
  return jnp.sum(stats[key], dtype=jnp.float32) if key in stats else jnp.float32(0)


def operand_sums(x: jax.Array, spec: spec_lib.QuantSpec) -> dict[str, jax.Array]:
  """Additive telemetry sums of quantizing ``x`` (contraction-last, any rank) with
  ``spec``: the :data:`COUNTS` scalars and ``log2_hist`` float32 [LOG2_BINS]."""
  return sums_of_blocks(*block_stats(x, spec))


def expert_sums(w_t: jax.Array, spec: spec_lib.QuantSpec) -> dict[str, jax.Array]:
  """:func:`operand_sums` of stacked expert weights [E, N, K], each expert quantized as a
  tensor of its own (as the grouped GEMM does), summed over the experts (``operands``
  counts one)."""
  qt, stats = jax.vmap(lambda w: block_stats(w, spec))(w_t)
  return sums_of_blocks(qt, stats, experts=True)


def add(*sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The sums of several operands together."""
  return {k: sum(s[k] for s in sums) for k in sums[0]}


def _quantile(hist: jax.Array, q: float) -> jax.Array:
  """floor(log2 scale) at quantile ``q`` of the histogram (NaN when it is empty)."""
  cdf = jnp.cumsum(hist)
  total = cdf[-1]
  idx = jnp.argmax(cdf >= q * total)
  return jnp.where(total > 0, (idx + LOG2_LOW).astype(jnp.float32), jnp.nan)


def summarize(sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The statistics of the module docstring from (added) sums (float32 scalars)."""
  ratio = lambda a, b: jnp.where(b > 0, a / jnp.where(b > 0, b, 1.0), jnp.nan)  # noqa: E731
  out = {"saturated_frac": ratio(sums["saturated_blocks"], sums["blocks"]),
         "underflow_frac": ratio(sums["underflow_blocks"], sums["blocks"]),
         "zero_block_frac": ratio(sums["zero_blocks"], sums["blocks"]),
         "scale_subnormal_frac": ratio(sums["scale_subnormal_blocks"], sums["blocks"]),
         "scale_zero_frac": ratio(sums["scale_zero_blocks"], sums["blocks"]),
         "kurtosis": ratio(sums["kurtosis_sum"], sums["operands"]),
         **{f"{r.name}_frac": ratio(sums[f"{r.name}_blocks"], sums[f"{r.name}_rule_blocks"])
            for r in telemetry_lib.SCALE_RULE_STATS}}
  for q in (5, 50, 95):
    out[f"scale_log2_p{q:02d}"] = _quantile(sums["log2_hist"], q / 100)
  return out
