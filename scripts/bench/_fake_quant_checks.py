"""Bit-identity checks of ``fake_quant.py``: fused vs payload paths in bf16 ulps, the integer
rounding vs the quantize payload, and an exhaustive sweep of float32 bit patterns."""

from __future__ import annotations

import _repo  # noqa: F401  (puts the repository on the path before fp8jax is imported)
import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.numerics import formats
from fp8jax.quant import qtensor


def _bf16_ulps(a, b):
  """(count of differing elements, max |a - b| in bf16 ulps), NaNs equal to NaNs."""
  def ordered(v):
    bits = lax.bitcast_convert_type(v.astype(jnp.bfloat16), jnp.int16).astype(jnp.int32)
    return jnp.where(bits < 0, -(bits & 0x7FFF), bits)
  both_nan = jnp.isnan(a) & jnp.isnan(b)
  diff = jnp.where(both_nan, 0, jnp.abs(ordered(a) - ordered(b)))
  return jnp.sum(diff != 0), jnp.max(diff)


_compare = jax.jit(_bf16_ulps)


def compare(a, b):
  n, mx = _compare(a, b)
  return int(n), int(mx)


def core_rounding_mismatches(x, spec):
  """round_to_format(x * s) vs the quantize payload from the same scaled values."""
  def f(v):
    qt, scaled, _ = qtensor.quantize_with_scaled(v, spec)
    a = formats.round_to_format(scaled, spec.fmt)
    b = qtensor.payload_f32(qt.data)
    same = (lax.bitcast_convert_type(a, jnp.uint32) == lax.bitcast_convert_type(b, jnp.uint32))
    return jnp.sum(~(same | (jnp.isnan(a) & jnp.isnan(b))))
  return int(jax.jit(f)(x))


def exhaustive_mismatches(fmt_name, log2_total, log2_chunk=28):
  """Bit patterns ``0 .. 2**log2_total - 1`` (all float32 at 32) where round_to_format
  differs from saturating_cast (NaN payloads ignored)."""
  fmt = formats.get_format(fmt_name)
  chunk = 1 << min(log2_chunk, log2_total)

  @jax.jit
  def count(base):
    bits = lax.iota(jnp.uint32, chunk) + base
    x = lax.bitcast_convert_type(bits, jnp.float32)
    a = formats.round_to_format(x, fmt)
    b = qtensor.payload_f32(formats.saturating_cast(x, fmt))
    same = lax.bitcast_convert_type(a, jnp.uint32) == lax.bitcast_convert_type(b, jnp.uint32)
    return jnp.sum(~(same | (jnp.isnan(a) & jnp.isnan(b))))

  total = 0
  for start in range(0, 1 << log2_total, chunk):
    total += int(count(jnp.uint32(start)))
  return total
