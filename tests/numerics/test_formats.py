"""fp8jax.numerics.formats: round_to_format against ml_dtypes casts in NumPy (independent
of XLA), on a structured sweep of float32 bit patterns, at the edges of each format, and
against the XLA cast."""

from __future__ import annotations

import functools

from hypothesis import given
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.numerics import formats
from tests.references import reference as ref

ALL_FORMATS = sorted(ref.FP8_DTYPES)


def _ml_dtypes_round(x: np.ndarray, fmt: str) -> np.ndarray:
  """Clip to ±max, cast with ml_dtypes, back to float32 (no XLA involved)."""
  fmax = np.float32(ref.FP8_MAX[fmt])
  with np.errstate(invalid="ignore", over="ignore"):
    return np.clip(x, -fmax, fmax).astype(ref.FP8_DTYPES[fmt]).astype(np.float32)


def _structured_bit_patterns() -> np.ndarray:
  """Both signs x all 256 exponents x all top-11 mantissa bits x 4 low-12-bit patterns.

  The low patterns (0, 1, 0x800, 0xFFF) with every top-11 pattern put values exactly on,
  just above and just below every rounding tie of the four formats (they round at bit 20
  or 21 of the mantissa, or higher below the normal range): 2**22 float32 values.
  """
  high = np.arange(1 << 20, dtype=np.uint32) << np.uint32(12)  # sign, exponent, top 11
  low = np.array([0x000, 0x001, 0x800, 0xFFF], np.uint32)
  return (high[:, None] | low[None, :]).reshape(-1)


@functools.partial(jax.jit, static_argnums=1)
def _round_bits(bits, fmt):
  return formats.round_to_format(jax.lax.bitcast_convert_type(bits, jnp.float32), fmt)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_round_to_format_matches_ml_dtypes_on_structured_bit_patterns(fmt):
  bits = _structured_bit_patterns()
  got = np.asarray(_round_bits(jnp.asarray(bits), formats.get_format(fmt)))
  want = _ml_dtypes_round(bits.view(np.float32), fmt)
  assert got.dtype == np.float32
  assert ref.same_bits(got, want)
  # NaN stays NaN and the signed zeros are where the cast puts them.
  assert np.array_equal(np.isnan(got), np.isnan(bits.view(np.float32)))
  zeros = want == 0
  assert np.array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_round_to_format_edges(fmt):
  f = formats.get_format(fmt)
  fmax, sub, nrm = np.float32(f.max), np.float32(f.min_subnormal), np.float32(f.min_normal)
  edges = [0.0, np.inf, np.nan, fmax, np.nextafter(fmax, np.float32(np.inf)), 2 * fmax,
           np.finfo(np.float32).max, sub, sub / 2, np.nextafter(sub / 2, np.float32(1)),
           1.5 * sub, 2.5 * sub, nrm, np.nextafter(nrm, np.float32(0)), nrm - sub / 2,
           nrm * (1 + 2.0**-f.mantissa_bits / 2), 1e-39, 1e-45, 1.0, 3.0, 1e30]
  x = np.array(edges, np.float32)
  x = np.concatenate([x, -x])
  got = np.asarray(formats.round_to_format(jnp.asarray(x), f))
  assert ref.same_bits(got, _ml_dtypes_round(x, fmt))
  assert np.all(np.abs(got[np.isfinite(got)]) <= fmax)
  assert np.asarray(formats.round_to_format(jnp.asarray(x, jnp.bfloat16), f)).dtype == np.float32


@functools.partial(jax.jit, static_argnums=1)
def _cast_and_round(x, fmt):
  return formats.saturating_cast(x, fmt).astype(jnp.float32), formats.round_to_format(x, fmt)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@given(values=st.lists(st.floats(width=32), min_size=64, max_size=64))
def test_round_to_format_equals_the_xla_cast(fmt, values):
  cast, rounded = _cast_and_round(jnp.asarray(np.array(values, np.float32)),
                                  formats.get_format(fmt))
  assert ref.same_bits(np.asarray(rounded), np.asarray(cast))
