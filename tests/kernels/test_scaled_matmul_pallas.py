"""The Pallas FP32-mode blockwise GEMM (interpreted on CPU) against the XLA interval loop."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import accumulate
from fp8jax.kernels import scaled_matmul_pallas as kernel

_GRANS = {"tile128/block128": (fp8jax.tile(128), fp8jax.block((128, 128))),
          "tensor/axis": (fp8jax.per_tensor(), fp8jax.per_axis(-1)),
          "tile32/tile128": (fp8jax.tile(32), fp8jax.tile(128))}


@functools.partial(jax.jit, static_argnums=(2, 3))
def _quantize_pair(a, b, spec_a, spec_b):
  return fp8jax.quantize(a, spec_a), fp8jax.quantize(b, spec_b)


def _quantized(seed, nb, m, n, k, gran, fmt_a, fmt_b=None, scale_format="fp32"):
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((nb, m, k)) * 10.0 ** rng.uniform(-3, 3, (nb, m, 1))
  b = rng.standard_normal((nb, n, k))
  a_gran, b_gran = _GRANS[gran]
  spec = fp8jax.QuantSpec(scale_format=scale_format)
  return _quantize_pair(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32),
                        spec.replace(format=fmt_a, granularity=a_gran),
                        spec.replace(format=fmt_b or fmt_a, granularity=b_gran))


@jax.jit
def _both(qa, qb):
  """(XLA loop, Pallas kernel; interpreted off GPU)."""
  return (accumulate.scaled_matmul(qa, qb, impl="xla"),
          accumulate.scaled_matmul(qa, qb, impl="pallas"))


def _assert_agree(got, want, qa, qb):
  """Equal up to float32 rounding: |diff| <= 1e-6 * sum_k |a_k b_k| (dequantized)."""
  da = np.abs(np.asarray(fp8jax.dequantize(qa, jnp.float32), np.float64))
  db = np.abs(np.asarray(fp8jax.dequantize(qb, jnp.float32), np.float64))
  mag = np.einsum("bmk,bnk->bmn", da, db)
  diff = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
  assert got.shape == want.shape and got.dtype == jnp.float32
  assert np.all(diff <= 1e-6 * mag), float(np.max(diff / np.maximum(mag, 1e-300)))


@pytest.mark.slow
@pytest.mark.parametrize("nb,m,n,k,gran,fmt_a,fmt_b,scale_format", [
    (1, 40, 24, 384, "tile128/block128", "e4m3", None, "fp32"),   # M, N not block multiples
    (2, 17, 33, 300, "tile128/block128", "e5m2", None, "pow2"),   # B > 1, K padded
    (1, 16, 20, 256, "tensor/axis", "e4m3", "e5m2", "fp32"),     # interval K: chained dots
    (2, 8, 16, 96, "tile32/tile128", "e5m2", "e4m3", "pow2"),     # interval 32
])
def test_pallas_matches_xla_loop(nb, m, n, k, gran, fmt_a, fmt_b, scale_format):
  qa, qb = _quantized(0, nb, m, n, k, gran, fmt_a, fmt_b, scale_format)
  want, got = _both(qa, qb)
  _assert_agree(got, want, qa, qb)


@pytest.mark.slow
def test_blocks_schedules_and_bf16_payloads():
  """Several programs along M and N with padded edges; every loop schedule, with one and
  with two dots per interval; payloads passed as bfloat16 or FP8 (e4m3 x e5m2)."""
  qa, qb = _quantized(1, 2, 40, 50, 384, "tile128/block128", "e4m3", "e5m2")
  want, _ = _both(qa, qb)
  configs = [(schedule, block_k) for schedule in kernel.SCHEDULES for block_k in (128, 64)]

  @jax.jit
  def run_all(qa, qb):
    sa = accumulate._interval_scales(qa, 128, 3)
    sb = accumulate._interval_scales(qb, 128, 3)
    interpret = jax.default_backend() != "gpu"
    out = [kernel.scaled_matmul_pallas(qa.data, qb.data, sa, sb, block_m=16, block_n=32,
                                       block_k=bk, schedule=sched, num_warps=4,
                                       interpret=interpret) for sched, bk in configs]
    out.append(kernel.scaled_matmul_pallas(
        qa.data.astype(jnp.bfloat16), qb.data.astype(jnp.bfloat16), sa, sb,
        interpret=interpret))
    return out

  for got in run_all(qa, qb):
    _assert_agree(got, want, qa, qb)


def test_supports_and_argument_errors():
  assert kernel.supports_interval(128) and kernel.supports_interval(16)
  assert kernel.supports_interval(4096) and not kernel.supports_interval(8)
  assert not kernel.supports_interval(96) and not kernel.supports_interval(200)
  assert kernel.supports_payload(jnp.float8_e5m2) and kernel.supports_payload(jnp.bfloat16)
  assert not kernel.supports_payload(jnp.float32) and not kernel.supports_payload(jnp.int8)
  a = jnp.zeros((1, 16, 128), jnp.float8_e4m3fn)
  s = jnp.ones((1, 16, 1), jnp.float32)
  with pytest.raises(ValueError, match="unsupported promotion interval 96"):
    kernel.scaled_matmul_pallas(a, a, s, s, interval=96, interpret=True)
  with pytest.raises(TypeError, match="8-bit floats or bfloat16"):
    kernel.scaled_matmul_pallas(a.astype(jnp.float32), a, s, s, interpret=True)
  with pytest.raises(ValueError, match="scales must be"):
    kernel.scaled_matmul_pallas(a, a, s, s, interval=64, interpret=True)
  with pytest.raises(ValueError, match="powers of two"):
    kernel.scaled_matmul_pallas(a, a, s, s, block_m=48, interpret=True)
  with pytest.raises(ValueError, match="block_k must be"):
    kernel.scaled_matmul_pallas(a, a, s, s, block_k=256, interpret=True)
  with pytest.raises(ValueError, match="schedule must be"):
    kernel.scaled_matmul_pallas(a, a, s, s, schedule="async", interpret=True)


def test_fp8_dots_take_the_payloads_as_they_are(monkeypatch):
  """``fp8_dots``: E4M3 payloads reach the kernel's dots unconverted (no bfloat16 copy
  before it); interpreted, the products are exact, so the result agrees with the XLA loop
  to float32 rounding. Mixed formats and bfloat16 payloads are refused by name."""
  qa, qb = _quantized(2, 1, 40, 24, 384, "tile128/block128", "e4m3")
  want = accumulate.scaled_matmul(qa, qb, impl="xla")
  seen, dot = [], jax.lax.dot_general
  monkeypatch.setattr(kernel.lax, "dot_general", lambda x, y, *a, **k: (
      seen.append((x.dtype, y.dtype)), dot(x, y, *a, **k))[1])
  got = accumulate.scaled_matmul(qa, qb, impl="pallas", fp8_mma=True)
  assert seen and set(seen) == {(jnp.dtype(jnp.float8_e4m3fn),) * 2}
  _assert_agree(got, want, qa, qb)
  seen.clear()
  accumulate.scaled_matmul(qa, qb, impl="pallas")
  assert set(seen) == {(jnp.dtype(jnp.bfloat16),) * 2}
  assert kernel.fp8_dots_apply(jnp.float8_e5m2, jnp.float8_e5m2)
  assert not kernel.fp8_dots_apply(jnp.float8_e4m3fn, jnp.float8_e5m2)
  assert not kernel.fp8_dots_apply(jnp.bfloat16, jnp.bfloat16)
  assert not kernel.fp8_dots_apply(jnp.float8_e4m3fn, jnp.float8_e4m3fn, 16)  # dots of 16
  s = jnp.ones((1, 16, 1), jnp.float32)
  a = jnp.zeros((1, 16, 128), jnp.float8_e4m3fn)
  for other in (a.astype(jnp.float8_e5m2), a.astype(jnp.bfloat16)):
    with pytest.raises(ValueError, match="fp8_dots needs E4M3 or E5M2 payloads of one format"):
      kernel.scaled_matmul_pallas(a, other, s, s, fp8_dots=True, interpret=True)
  with pytest.raises(ValueError, match="fp8_dots needs dots of at least 32 elements of K, got 16"):
    kernel.scaled_matmul_pallas(a, a, jnp.ones((1, 16, 8)), jnp.ones((1, 16, 8)), interval=16,
                                fp8_dots=True, interpret=True)
