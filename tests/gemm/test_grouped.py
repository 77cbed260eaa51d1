"""The grouped FP8 GEMM against per-expert fp8_dot_general."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import grouped as grouped_gemm
from tests.helpers import assert_close
from tests.references import reference_gemm as rg


def _case(sizes=(128, 0, 256), k=256, f=128, seed=0):
  rng = np.random.default_rng(seed)
  n = sum(sizes)
  x = jnp.asarray(rng.standard_normal((n, k)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((len(sizes), k, f)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((n, f)) * 1e-2, jnp.float32)
  return x, w, dy, jnp.asarray(sizes, jnp.int32)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["requant", "double", "scaling_aware"])
def test_matches_per_expert_dot_general(policy):
  """Ragged group sizes: Wgrad pads each group to whole 128-row tiles, so no tile spans two
  experts and every dW_e equals the dense GEMM on that expert's rows alone."""
  x, w, dy, sizes = _case(sizes=(150, 0, 90, 128))
  cfg = fp8jax.GemmConfig(transpose=policy)
  y, vjp = jax.vjp(lambda a, b: grouped_gemm.fp8_ragged_dot(a, b, sizes, cfg), x, w)
  dx, dw = vjp(dy)
  start = 0
  dn = (((1,), (0,)), ((), ()))
  for e, size in enumerate(np.asarray(sizes)):
    rows = slice(start, start + size)
    start += size
    if size == 0:
      np.testing.assert_array_equal(dw[e], 0)
      continue
    ye, vjp_e = jax.vjp(lambda a, b: fp8jax.fp8_dot_general(a, b, dn, config=cfg),
                        x[rows], w[e])
    dxe, dwe = vjp_e(dy[rows])
    assert_close(y[rows], ye)
    assert_close(dx[rows], dxe)
    assert_close(dw[e], dwe)


@pytest.mark.slow
def test_bf16_mode_and_errors():
  x, w, dy, sizes = _case(sizes=(50, 70, 8), seed=1)
  y = grouped_gemm.fp8_ragged_dot(x, w, sizes, fp8jax.gemm.dense.BF16)
  ref = jax.lax.ragged_dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), sizes,
                           preferred_element_type=jnp.float32)
  assert_close(y, ref)
  g = jax.grad(lambda b: jnp.sum(grouped_gemm.fp8_ragged_dot(x, b, sizes) ** 2))(w)
  assert np.all(np.isfinite(g))
  native = fp8jax.recipe("fp8_tensor").replace(fprop="fp8_native")
  with pytest.raises(ValueError, match="fp8_native is not available"):
    grouped_gemm.fp8_ragged_dot(x, w, sizes, native)


DN = (((1,), (0,)), ((), ()))


def _vjp(fn, a, b, ct):
  """(fn(a, b), d/da, d/db) for the cotangent ct."""
  y, vjp = jax.vjp(fn, a, b)
  return (y, *vjp(ct))


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["requant", "double", "scaling_aware"])
def test_tensor_core_accumulation_equals_dense_per_expert_bit_for_bit(policy):
  """Ragged groups (none a multiple of the promotion interval, one empty): each expert's
  rows of Y and dX and its dW equal fp8_dot_general with the same accumulator on the
  expert's rows alone, bit for bit. eps=0 gives the all-zero padding rows of the Wgrad
  layout scale 1, above the real rows' scales: the transposes must not see them."""
  x, w, dy, sizes = _case(sizes=(150, 0, 37), k=160, f=144, seed=3)
  cfg = fp8jax.GemmConfig(roles=fp8jax.deepseek_v3_roles(eps=0.0), transpose=policy,
                          accumulation=fp8jax.gemm.accumulate.HOPPER)
  y, dx, dw = jax.jit(lambda a, b, c: _vjp(
      lambda p, q: grouped_gemm.fp8_ragged_dot(p, q, sizes, cfg), a, b, c))(x, w, dy)
  dense = jax.jit(lambda a, b, c: _vjp(
      lambda p, q: fp8jax.fp8_dot_general(p, q, DN, config=cfg), a, b, c))
  start = 0
  for e, size in enumerate(np.asarray(sizes)):
    rows = slice(start, start + size)
    start += size
    if size == 0:
      np.testing.assert_array_equal(dw[e], 0)
      continue
    ye, dxe, dwe = dense(x[rows], w[e], dy[rows])
    np.testing.assert_array_equal(y[rows], ye)
    np.testing.assert_array_equal(dx[rows], dxe)
    np.testing.assert_array_equal(dw[e], dwe)


def _rows_and_scales(qt):
  """A 2-D QTensor's payload [R, K] (float32) and scale_inv per row and K block."""
  s = np.repeat(np.asarray(qt.scale_inv, np.float32), qt.full_block[-2], axis=0)
  return np.asarray(qt.data, np.float32), s[: qt.shape[-2]], qt.full_block[-1]


def _loop(a_qt, b_qt, rows, cols):
  """tests/reference_gemm's loop model on the given rows of A and rows of Bt."""
  a, sa, ka = _rows_and_scales(a_qt)
  b, sb, kb = _rows_and_scales(b_qt)
  return rg.ref_tensor_core_matmul(a[rows], b[cols], sa[rows], sb[cols], ka, kb)


@pytest.mark.slow
def test_tensor_core_grouped_against_numpy_loops():
  """A few outputs of each GEMM of one expert (rows 40..239 of the sorted rows, after an
  expert of 40 and an empty one) against the loop reference on that expert's operands,
  quantized on their own: X, dY in 1x128 tiles, W in 128x128 blocks (Fprop W_e^T, Dgrad
  W_e), X_e^T and dY_e^T in tiles along the expert's 200 tokens."""
  x, w, dy, sizes = _case(sizes=(40, 0, 200), k=160, f=144, seed=4)
  cfg = fp8jax.recipe("hopper_blockwise")
  y, dx, dw = jax.jit(lambda a, b, c: _vjp(
      lambda p, q: grouped_gemm.fp8_ragged_dot(p, q, sizes, cfg), a, b, c))(x, w, dy)
  r = cfg.roles

  @jax.jit
  def operands(xe, dye, we):  # the expert's operands of Fprop, Dgrad and Wgrad
    q = fp8jax.quantize
    return ((q(xe, r.input), q(we.T, r.weight)), (q(dye, r.grad), q(we, r.weight)),
            (q(xe.T, r.input), q(dye.T, r.grad)))

  fprop, dgrad, wgrad = operands(x[40:], dy[40:], w[2])
  rows, cols, kcols = [0, 7, 131, 199], [0, 5, 128, 143], [0, 31, 129, 159]
  np.testing.assert_array_equal(np.asarray(y)[40:][np.ix_(rows, cols)],
                                _loop(*fprop, rows, cols))
  np.testing.assert_array_equal(np.asarray(dx)[40:][np.ix_(rows, kcols)],
                                _loop(*dgrad, rows, kcols))
  np.testing.assert_array_equal(np.asarray(dw)[2][np.ix_(kcols, cols)],
                                _loop(*wgrad, kcols, cols))
  # Not FP32 accumulation under another name: the FP32 grouped GEMM differs.
  y32 = jax.jit(lambda a, b: grouped_gemm.fp8_ragged_dot(
      a, b, sizes, fp8jax.recipe("fp32_blockwise")))(x, w)
  assert not np.array_equal(np.asarray(y32), np.asarray(y))


@pytest.mark.slow
def test_tensor_core_never_promoting_needs_scales_constant_along_the_tokens():
  x, w, dy, sizes = _case(sizes=(20, 12), k=64, f=32, seed=5)
  acc = fp8jax.gemm.accumulate.HOPPER_NO_PROMOTION
  spec = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.per_tensor())
  cfg = fp8jax.GemmConfig(roles=fp8jax.RoleSpecs(input=spec, weight=spec, grad=spec),
                          accumulation=acc)
  wgrad = jax.jit(jax.grad(lambda b, c: jnp.sum(grouped_gemm.fp8_ragged_dot(x, b, sizes, c) * dy)),
                  static_argnums=1)
  g = wgrad(w, cfg)
  assert np.all(np.isfinite(g)) and np.any(g != 0)
  tiles = cfg.replace(roles=fp8jax.deepseek_v3_roles())  # 1x128 tiles along the tokens
  with pytest.raises(ValueError, match="never promotes"):
    wgrad(w, tiles)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["requant", "scaling_aware"])
def test_blockwise_kernel_path_equals_the_xla_simulation(policy, monkeypatch):
  """On one GPU the FP32-accumulation grouped GEMM runs in the blockwise-scaled kernel
  (here interpreted): the same operands and scales as the XLA path, scaled per promotion
  interval instead of per element, so equal to float32 rounding. Ragged sizes (Wgrad on
  groups padded to whole tiles), an empty expert, rows past the sum."""
  x, w, dy, _ = _case(sizes=(150, 0, 90), k=256, f=256)
  sizes = jnp.asarray([150, 0, 70], jnp.int32)  # 20 rows past the sum
  cfg = fp8jax.GemmConfig(transpose=policy)

  def run(impl):
    y, vjp = jax.vjp(lambda a, b: grouped_gemm.fp8_ragged_dot(a, b, sizes,
                                                              cfg.replace(impl=impl)), x, w)
    return (y, *vjp(dy))

  want = run("xla")
  calls = []
  kernel = grouped_gemm.grouped_scaled_pallas
  for name in ("grouped_scaled_matmul", "grouped_scaled_wgrad"):
    fn = getattr(kernel, name)
    monkeypatch.setattr(kernel, name, lambda *a, fn=fn, name=name, **k: (
        calls.append(name), fn(*a, **k))[1])
  got = run("pallas")
  assert sorted(calls) == ["grouped_scaled_matmul"] * 2 + ["grouped_scaled_wgrad"]
  for g, r, what in zip(got, want, ("y", "dx", "dw"), strict=True):
    g, r = np.asarray(g), np.asarray(r)
    assert not np.array_equal(g, 0), what
    np.testing.assert_array_equal(g[220:] if what != "dw" else g[1], 0)
    err = np.abs(g - r).max() / np.abs(r).max()
    assert err < 1e-5, (what, err)
