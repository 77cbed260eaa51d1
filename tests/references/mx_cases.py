"""Shared cases of the MX / NVFP4 tests: presets, shapes, the hypothesis array strategy
and the bit-for-bit check of quantize / dequantize against ``tests/references/reference_mx.py``."""

import math

from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import fp8jax
from fp8jax.quant import fused_round_trip
from tests.references import reference_mx as ref

FORMAT_NAMES = sorted(ref.FORMATS)
MX_PRESETS = ["mxfp8", "mxfp8_ocp", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4",
              "mxfp4_rceil"]
NV_PRESETS = ["nvfp4", "nvfp4_weight"]
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
# A few shapes (so that compiled kernels are reused), rank 1-3, with last dims that
# 16 and 32 do not divide, and dims smaller than a tile.
SHAPES = [(70,), (1,), (33,), (3, 33), (2, 48), (17, 20), (32, 32), (2, 3, 40), (1, 5, 7)]
FEW = settings(max_examples=4, deadline=None)
MANY = settings(max_examples=15, deadline=None)
FORMAT_BITS = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4}


def all_values(dtype) -> np.ndarray:
  """Every code of an ml_dtypes type (4/6/8 bits in a byte), as float64."""
  bits = next((b for n, b in FORMAT_BITS.items() if ref.FORMATS[n].dtype == dtype), 8)
  codes = np.arange(2**bits, dtype=np.uint8).view(dtype)
  return codes.astype(np.float64)


@st.composite
def mx_arrays(draw, shapes=tuple(SHAPES), dtypes=tuple(DTYPES)):
  """Arrays whose 16-element runs each sit in their own binade range.

  Runs far apart give tiny blocks next to huge ones (NVFP4 block scales of 0), wide
  runs put elements into the element format's subnormal range, dyadic mantissas make
  exact ties, and there are zero runs, signed zeros, float32 subnormals, inf and NaN.
  Hypothesis draws the shape, dtype and a seed; the mix is drawn from the seed run by
  run, so that even the simplest (derandomized) examples hold every kind of run.
  """
  shape = draw(st.sampled_from(shapes))
  dtype = draw(st.sampled_from(dtypes))
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  n = math.prod(shape)
  n_runs = n // 16 + 1
  center = int(rng.integers(-100, 101))
  wide = int(rng.choice([0, 3, 24, 120]))
  run_exp = center + rng.integers(-wide, wide + 1, n_runs)
  run_within = rng.choice([0, 2, 6, 14, 40], n_runs)
  run_dyadic = rng.random(n_runs) < 0.5  # 5-bit mantissas: exact ties for every format
  run_zero = rng.random(n_runs) < 0.1
  per = lambda v: np.repeat(v, 16)[:n]
  exps = per(run_exp) - (rng.random(n) * (per(run_within) + 1)).astype(np.int64)
  exps = np.clip(exps, -140, 127)
  mant = np.where(per(run_dyadic), rng.integers(16, 32, n) / 16, rng.uniform(1, 2, n))
  x = rng.choice([-1.0, 1.0], n) * mant * np.exp2(exps.astype(np.float64))
  x[per(run_zero)] = 0.0
  zeros = rng.random(n) < 0.05
  x[zeros] = rng.choice([0.0, -0.0], int(zeros.sum()))
  if rng.random() < 0.5:
    k = int(rng.integers(1, 4))
    x[rng.integers(0, n, k)] = rng.choice([np.nan, np.inf, -np.inf], k)
  with np.errstate(over="ignore"):
    return x.astype(DTYPES[dtype]).reshape(shape)


def to_np(a):
  return None if a is None else np.asarray(a)


quantize_jit = jax.jit(fp8jax.quantize, static_argnums=1)
dequantize_jit = jax.jit(fp8jax.dequantize, static_argnums=1)
QDQ_PATHS = {"quantize_dequantize": fp8jax.quantize_dequantize,
              "fused": fused_round_trip.quantize_dequantize_fused, "fake_quant": fp8jax.fake_quant}
QDQ_JIT = {k: jax.jit(f, static_argnums=1) for k, f in QDQ_PATHS.items()}


def check_quantize(x, spec, jit=True):
  """quantize and dequantize (jitted, or eager) vs the reference: payload, scales,
  block, values."""
  r = ref.ref_for_spec(x, spec)
  qt = (quantize_jit if jit else fp8jax.quantize)(jnp.asarray(x), spec)
  data, scale_inv = to_np(qt.data), to_np(qt.scale_inv)
  info = f"spec={spec.describe()} x.shape={x.shape} x.dtype={x.dtype}"
  assert tuple(qt.block) == r.block, info
  errs = ref.mismatches(data, r.payload, mask=~r.unspecified)
  assert not errs, f"payload: {info}\n" + "\n".join(errs)
  errs = ref.mismatches(scale_inv, r.scale_inv)
  assert not errs, f"scale_inv: {info}\n" + "\n".join(errs)
  if r.tensor_scale_inv is None:
    assert qt.tensor_scale_inv is None, info
  else:
    got = to_np(qt.tensor_scale_inv)
    assert got.dtype == np.float32 and got.shape == (), info
    assert ref.bits(got) == ref.bits(r.tensor_scale_inv), (info, got, r.tensor_scale_inv)
  deq = to_np(dequantize_jit(qt, None) if jit else fp8jax.dequantize(qt))
  errs = ref.mismatches(deq, r.deq)
  assert not errs, f"dequantized: {info}\n" + "\n".join(errs)
  return r
