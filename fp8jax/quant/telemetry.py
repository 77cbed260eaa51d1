"""Quantization telemetry: a small pytree of scalars per quantize call, and the per-block
choices of the scale rules that choose (:data:`SCALE_RULE_STATS`).

It is computed only when asked for (a Python-level switch), so it costs nothing when
off. Non-finite inputs are counted, never folded into the power averages.

A scale rule's statistic counts, over the nonzero finite blocks of a tensor quantized
with that rule (its *rule blocks*), those where the rule chose:

- ``four``: Four Over Six (``QuantSpec.four_over_six``, arXiv 2512.02010) mapped the
  block's maximum to 4 instead of 6;
- ``oas_raised``: OAS (``pow2_rounding="oas"``, arXiv 2603.08713) took a power-of-two
  scale one binade above the OCP rule's ``2^(floor(log2 amax) - emax)`` for the same
  block (its maximum's mantissa would have rounded past the element format's top):
  OAS's departure from OCP, which trades saturation for a coarser grid.

A further rule adds one :class:`ScaleRuleStat`; the sums and summaries of
:mod:`fp8jax.gemm.operand_telemetry` and the ``*_frac`` fields here follow the registry.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses

import jax
import jax.numpy as jnp

from fp8jax.numerics import blocks, formats, four_over_six, scales


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantTelemetry:
  """Scalars (float32) describing one quantization.

  Attributes:
    amax: largest finite |x| of the tensor.
    scale_min: smallest quantization multiplier ``s`` over the blocks (a block holding
      NaN or inf has ``s = 1``).
    scale_max: largest ``s`` over the blocks.
    saturated_frac: fraction of elements that the saturating cast clipped: those
      where a plain cast of x * s would overflow (±inf inputs included). Values
      that round down to ±max anyway (e.g. 460 in E4M3) are not counted.
    underflow_frac: fraction of the non-zero finite elements flushed to zero.
    nonfinite_frac: fraction of elements that are NaN or ±inf.
    signal_power: mean x**2 over finite elements.
    noise_power: mean (x - x_hat)**2 over finite elements; NaN when a block holding NaN
      or inf made its finite elements NaN too (``fp8jax.numerics.scales``).
    snr_db: 10 log10(signal_power / noise_power); +inf when the round trip is exact, NaN
      with a NaN noise power.
    four_frac, oas_raised_frac: the share of the rule blocks where Four Over Six scaled
      to 4, and where OAS raised the scale (module docstring); NaN when the spec does not
      use the rule or the tensor has no nonzero finite block.
  """

  amax: jax.Array
  scale_min: jax.Array
  scale_max: jax.Array
  saturated_frac: jax.Array
  underflow_frac: jax.Array
  nonfinite_frac: jax.Array
  signal_power: jax.Array
  noise_power: jax.Array
  snr_db: jax.Array
  four_frac: jax.Array
  oas_raised_frac: jax.Array


def measure(x: jax.Array, scaled: jax.Array, payload: jax.Array, x_hat: jax.Array,
            s: jax.Array, fmt, rule_blocks: dict[str, jax.Array] | None = None
            ) -> QuantTelemetry:
  """Telemetry of one quantization.

  Args:
    x: the input, any shape.
    scaled: ``x * s`` in float32 before the cast, shape of ``x``.
    payload: the stored payload, shape of ``x``.
    x_hat: the dequantized tensor, shape of ``x``.
    s: per-block quantization multipliers (any shape).
    fmt: the element format (``fp8jax.numerics.formats.FloatFormat``). An element is
      saturated where round-to-nearest-even with an unbounded exponent would give a
      magnitude above ``fmt.max``.
    rule_blocks: :func:`scale_rule_blocks` of the quantization, or None (no rule).
  """
  xf = x.astype(jnp.float32)
  finite = jnp.isfinite(xf)
  n = jnp.float32(max(x.size, 1))
  n_finite = jnp.maximum(jnp.sum(finite, dtype=jnp.float32), 1.0)
  x0 = jnp.where(finite, xf, 0.0)
  err = jnp.where(finite, x0 - x_hat.astype(jnp.float32), 0.0)
  nonzero = finite & (xf != 0)
  flushed = nonzero & (payload.astype(jnp.float32) == 0)
  signal = jnp.sum(x0 * x0) / n_finite
  noise = jnp.sum(err * err) / n_finite
  overflow = saturates(jnp.abs(scaled.astype(jnp.float32)), fmt)
  snr = jnp.where(noise > 0, 10.0 * jnp.log10(signal / jnp.where(noise > 0, noise, 1.0)),
                  jnp.where(noise == 0, jnp.inf, jnp.nan))  # NaN noise: NaN, never +inf
  return QuantTelemetry(
      amax=jnp.max(jnp.abs(x0), initial=0.0),
      scale_min=jnp.min(s).astype(jnp.float32) if s.size else jnp.float32(0),
      scale_max=jnp.max(s).astype(jnp.float32) if s.size else jnp.float32(0),
      saturated_frac=jnp.sum(overflow, dtype=jnp.float32) / n,
      underflow_frac=jnp.sum(flushed, dtype=jnp.float32)
      / jnp.maximum(jnp.sum(nonzero, dtype=jnp.float32), 1.0),
      nonfinite_frac=jnp.sum(~finite, dtype=jnp.float32) / n,
      signal_power=signal,
      noise_power=noise,
      snr_db=snr.astype(jnp.float32),
      **{f"{r.name}_frac": _share(rule_blocks or {}, r.name) for r in SCALE_RULE_STATS},
  )


def _share(rule_blocks: dict[str, jax.Array], name: str) -> jax.Array:
  """Chosen blocks over rule blocks (NaN without rule blocks), float32 scalar."""
  if name not in rule_blocks:
    return jnp.float32(jnp.nan)
  hit, n = (jnp.sum(rule_blocks[k], dtype=jnp.float32) for k in (name, f"{name}_rule"))
  return jnp.where(n > 0, hit / jnp.maximum(n, 1.0), jnp.float32(jnp.nan))


@dataclasses.dataclass(frozen=True)
class ScaleRuleStat:
  """A scale rule's per-block choice (module docstring).

  Attributes:
    name: the statistic's name (``four``): per-block keys ``name`` and ``name_rule``,
      sums ``name_blocks`` and ``name_rule_blocks``, the share ``name_frac``.
    applies: whether a spec quantizes with the rule.
    chosen: ``(x, scale_inv, amax, block, spec)`` -> bool per block (``scale_inv``'s
      shape): where the rule chose, for ``x`` quantized with ``spec`` in blocks of
      ``block`` into float32 ``scale_inv`` from the block maxima ``amax``.
  """

  name: str
  applies: Callable
  chosen: Callable


def _mapped_to_four(x, scale_inv, amax, block, spec):
  del scale_inv, amax
  return four_over_six.scales_of(x, block, spec)[3]


def _oas_raised(x, scale_inv, amax, block, spec):
  del x, block
  return scale_inv > scales.compute_scale(amax, spec.replace(pow2_rounding="ocp"))[1]


SCALE_RULE_STATS = (
    ScaleRuleStat("four", lambda s: s.four_over_six is not None, _mapped_to_four),
    ScaleRuleStat("oas_raised", lambda s: s.scale_format == "pow2"
                  and s.pow2_rounding == "oas", _oas_raised),
)
"""The scale rules' per-block statistics (module docstring)."""


def scale_rule_blocks(x: jax.Array, qt, spec, amax: jax.Array | None = None
                      ) -> dict[str, jax.Array]:
  """Per-block float32 0/1 arrays (``qt.scale_inv``'s shape) of the rules ``spec``
  quantizes with (current scaling): ``name_rule`` marks the nonzero finite blocks,
  ``name`` those where the rule chose; {} when no rule applies.

  Args:
    x: the tensor quantized, any shape.
    qt: its quantization with ``spec`` (a :class:`fp8jax.quant.qtensor.QTensor`).
    spec: the spec (its noise control ignored).
    amax: the per-block maxima (``scale_inv``'s shape) when the caller has them.
  """
  rules = [r for r in SCALE_RULE_STATS if spec.scaling == "current" and r.applies(spec)]
  if not rules:
    return {}
  f32 = jnp.float32
  amax = blocks.block_amax(x, qt.full_block) if amax is None else amax
  live = (amax > 0) & jnp.isfinite(amax)
  inv = qt.scale_inv.astype(f32)
  out = {}
  for r in rules:
    out[r.name] = (live & r.chosen(x, inv, amax, qt.block, spec)).astype(f32)
    out[f"{r.name}_rule"] = live.astype(f32)
  return out


saturates = formats.saturates  # also this module's API
