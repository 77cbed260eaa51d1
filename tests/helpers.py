"""Shared test helpers: the spec-to-reference adapter and a tolerance check."""

import numpy as np

from tests import reference as ref


def ref_for_spec(x, spec):
  """(payload, scale_inv, dequantized) of the independent reference for ``spec``."""
  g = spec.granularity
  return ref.ref_quantize(
      np.asarray(x), spec.format, g.kind, g.axes, g.sizes, eps=spec.eps,
      margin=spec.margin, scale_format=spec.scale_format, rounding=spec.pow2_rounding,
      store_e8m0=spec.store_e8m0)


def assert_close(got, want):
  """Equal up to float32 summation-order rounding (a wiring error is ~1% off)."""
  want = np.asarray(want)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.max(np.abs(want)))
