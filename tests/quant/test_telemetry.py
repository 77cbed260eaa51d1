"""Quantization telemetry (``fp8jax.quant.telemetry.measure``) against hand-computed
values."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.numerics import formats
from fp8jax.quant import telemetry


def test_measure_counts_and_powers_by_hand():
  """E4M3 (max 448; |v| > 464 saturates), multiplier 250: 1 -> 250 -> payload 256,
  -2 -> -500 saturates to -448, 1e-6 -> 2.5e-4 flushes to 0; inf saturates, NaN does
  not. Finite elements: 1, -2, 0, 1e-6."""
  x = jnp.asarray([1.0, -2.0, 0.0, 1e-6, np.inf, np.nan], jnp.float32)
  scaled = x * 250.0
  payload = jnp.asarray([256.0, -448.0, 0.0, 0.0, 448.0, np.nan], jnp.float32)
  x_hat = payload / 250.0
  tel = telemetry.measure(x, scaled, payload, x_hat, jnp.asarray([250.0, 125.0]),
                          formats.get_format("e4m3"))
  signal = (1.0 + 4.0 + 0.0 + 1e-12) / 4
  noise = ((1 - 1.024) ** 2 + (-2 + 1.792) ** 2 + 0.0 + 1e-12) / 4
  assert float(tel.amax) == 2.0
  assert (float(tel.scale_min), float(tel.scale_max)) == (125.0, 250.0)
  assert float(tel.saturated_frac) == pytest.approx(2 / 6)
  assert float(tel.underflow_frac) == pytest.approx(1 / 3)
  assert float(tel.nonfinite_frac) == pytest.approx(2 / 6)
  assert float(tel.signal_power) == pytest.approx(signal, rel=1e-6)
  assert float(tel.noise_power) == pytest.approx(noise, rel=1e-4)
  assert float(tel.snr_db) == pytest.approx(10 * math.log10(signal / noise), rel=1e-4)
  assert math.isnan(float(tel.four_frac)) and math.isnan(float(tel.oas_raised_frac))


def test_measure_exact_round_trip_and_rule_shares():
  """An exact round trip has SNR +inf; a rule's share is its chosen blocks over its rule
  blocks, NaN without rule blocks."""
  x = jnp.asarray([[0.5, -1.0], [2.0, 0.25]], jnp.float32)
  blocks = {"four": jnp.asarray([1.0, 0.0, 1.0, 0.0]),
            "four_rule": jnp.asarray([1.0, 1.0, 1.0, 0.0]),
            "oas_raised": jnp.zeros(4), "oas_raised_rule": jnp.zeros(4)}
  tel = telemetry.measure(x, x, x, x, jnp.ones(()), formats.get_format("e4m3"), blocks)
  assert float(tel.noise_power) == 0.0 and float(tel.snr_db) == np.inf
  assert float(tel.saturated_frac) == 0.0 and float(tel.underflow_frac) == 0.0
  assert float(tel.four_frac) == pytest.approx(2 / 3)
  assert math.isnan(float(tel.oas_raised_frac))
