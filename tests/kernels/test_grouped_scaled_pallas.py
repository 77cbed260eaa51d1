"""The grouped blockwise-scaled Pallas GEMM (interpreted on CPU) against an independent NumPy
loop, the XLA reference and the dense ``accumulate.scaled_matmul`` (FP32 mode) per expert.

Tolerance. The NumPy loop sums each interval's products in float64 (exact for E4M3
payloads), rounds the sum to float32 once, then scales and accumulates in float32 as the
kernel does. The kernel sums an interval's ``interval`` products in float32 in the dot's
order, so by the first-order worst-case bound of float32 summation the two differ by at most
``(interval + J + 1) * 2**-24 * mag``, where ``mag = sum_j |sa_j sb_j| sum_k |a_k b_k|`` and
``J`` intervals are promoted (the ``+ J + 1``: the promotions' roundings and a possible FMA).
Two float32 implementations (kernel, XLA) may each be that far from the exact value: twice
the bound. Every interval of the test data has its own scale (magnitudes 10**[-2, 2]), so a
wrong scale, group or interval is off by O(mag), far outside the bound (checked below).
Zero rows (past ``sum(group_sizes)``, empty groups) must be exactly zero; the interpreter
fills unwritten outputs with NaN, so an unwritten element fails too.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import accumulate
from fp8jax.kernels import grouped_scaled_pallas as gsp
from tests.references import grouped_scaled_reference as ref

U = 2.0**-24


def _f64(x):
  return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def _quantize(x, fmt, block):
  """QTensor of ``x`` (float32) with ``block`` = tile(n) or block((n, n)) along its last axes."""
  return jax.jit(lambda v: fp8jax.quantize(v, fp8jax.QuantSpec(format=fmt, granularity=block))
                 )(jnp.asarray(x, jnp.float32))


def _varied(rng, shape, interval):
  """Normal values whose magnitude (10**[-2, 2]) changes every ``interval`` of the last axis."""
  k = shape[-1]
  levels = 10.0 ** rng.uniform(-2, 2, (*shape[:-1], -(-k // interval)))
  return rng.standard_normal(shape) * np.repeat(levels, interval, axis=-1)[..., :k]


def _assert_close(got, want, mag, bound_terms, factor=1):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape and np.all(np.isfinite(got))
  diff = np.abs(got - want)
  bound = factor * bound_terms * U * mag
  assert np.all(diff <= bound), float(np.max(diff / np.maximum(mag, 1e-300)))


def _np_rows(a, sa, bt, sb, sizes, interval):
  """Y float32 [N, F] and mag: per group, per interval, the exact sum of the products
  (float64) rounded to float32, times float32 ``sa * sb``, added to a float32 accumulator.
  a [N, K], sa [N, J], bt [E, F, K], sb [E, F, J] per column."""
  n, k = a.shape
  y = np.zeros((n, bt.shape[1]), np.float32)
  mag = np.zeros(y.shape)
  start = 0
  for g, size in enumerate(sizes):
    rows = slice(start, start + size)
    for j in range(-(-k // interval)):
      ks = slice(j * interval, min(k, (j + 1) * interval))
      part = (a[rows, ks] @ bt[g][:, ks].T).astype(np.float32)
      scale = (sa[rows, j][:, None] * sb[g][None, :, j]).astype(np.float32)
      y[rows] = y[rows] + part * scale
      mag[rows] += (np.abs(a[rows, ks]) @ np.abs(bt[g][:, ks]).T) * np.abs(scale)
    start += size
  return y, mag


def _np_wgrad(at, sa, bt, sb, sizes, interval):
  """dW float32 [E, K, F] and mag, the same way over each group's rows of each interval.
  at [K, N], sa [K, J], bt [F, N], sb [F, J]."""
  e = len(sizes)
  dw = np.zeros((e, at.shape[0], bt.shape[0]), np.float32)
  mag = np.zeros(dw.shape)
  start = 0
  for g, size in enumerate(sizes):
    end = start + size
    for j in range(start // interval, -(-end // interval)) if size else ():
      r = slice(max(start, j * interval), min(end, (j + 1) * interval))
      part = (at[:, r] @ bt[:, r].T).astype(np.float32)
      scale = (sa[:, j][:, None] * sb[:, j][None, :]).astype(np.float32)
      dw[g] = dw[g] + part * scale
      mag[g] += (np.abs(at[:, r]) @ np.abs(bt[:, r]).T) * np.abs(scale)
    start = end
  return dw, mag


def _per_group(qt, sizes, axis, interval):
  """The groups of ``qt`` (rows along ``axis`` of its data, scales per ``interval`` rows along
  that axis when it is the last, else per row) stacked as a batch [E, ...], each group
  zero-padded to the longest (payload 0, scale 1: zero products, and rows of their own in
  a GEMM whose rows are independent)."""
  longest = -(-max(sizes) // interval) * interval
  data, scale = np.asarray(qt.data), np.asarray(qt.scale_inv.astype(jnp.float32))
  out_d, out_s = [], []
  start = 0
  for size in sizes:
    d = np.take(data, np.arange(start, start + size), axis=axis)
    if axis == 1:
      sc = scale[:, start // interval:(start + size) // interval]
    else:
      sc = scale[start:start + size]
    pad_d, pad_s = [(0, 0), (0, 0)], [(0, 0), (0, 0)]
    pad_d[axis] = (0, longest - size)
    pad_s[axis] = (0, (longest - size) // interval if axis == 1 else longest - size)
    out_d.append(np.pad(d, pad_d))
    out_s.append(np.pad(sc, pad_s, constant_values=1.0))
    start += size
  return dataclasses.replace(qt, data=jnp.asarray(np.stack(out_d)),
                             scale_inv=jnp.asarray(np.stack(out_s)))


_dense = jax.jit(lambda a, b: accumulate.scaled_matmul(a, b, accumulate.FP32, impl="xla"))


# (fmt, interval, K, F, b_block_n, sizes, extra rows, blocks, bf16 weight, convert_in_kernel)
ROWS_CASES = {
    # K padded (3 intervals of 32, the last partial), 3 weight scale blocks along F, two of
    # them per 64-column program, F not whole blocks; empty groups, rows past the sum.
    "k_tail": ("e4m3", 32, 80, 72, 32, [0, 23, 1, 30, 0, 9], 12,
               gsp.Blocks(m=16, n=64, k=16), False, False),
    # Interval 128 in two dots, whole column blocks, no rows past the sum; bf16 weight
    # payloads beside E5M2 rows, 8-bit payloads converted in the kernel.
    "interval128": ("e5m2", 128, 256, 48, 128, [40, 0, 0, 17], 0,
                    gsp.Blocks(m=32, n=16, k=64), True, True),
}


@pytest.mark.slow
@pytest.mark.parametrize("transpose_b", [True, False])
@pytest.mark.parametrize("case", sorted(ROWS_CASES))
def test_rows_match_numpy_reference_and_per_expert_gemm(case, transpose_b):
  fmt, interval, k, f, bnb, sizes, extra, blocks, bf16_w, in_kernel = ROWS_CASES[case]
  rng = np.random.default_rng(len(case))
  n, e = sum(sizes) + extra, len(sizes)
  xq = _quantize(_varied(rng, (n, k), interval), fmt, fp8jax.tile(interval))
  wq = _quantize(_varied(rng, (e, f, k), interval), fmt, fp8jax.block((bnb, interval)))
  w_data = wq.data.astype(jnp.bfloat16) if bf16_w else wq.data  # [E, F, K]
  b, b_scale = w_data, wq.scale_inv  # [E, F/bnb, J]
  if not transpose_b:
    b, b_scale = jnp.swapaxes(b, 1, 2), jnp.swapaxes(b_scale, 1, 2)
  group_sizes = jnp.asarray(sizes, jnp.int32)
  kwargs = dict(transpose_b=transpose_b, interval=interval, b_block_n=bnb)
  got = jax.jit(lambda *ops: gsp.grouped_scaled_matmul(
      *ops, blocks=blocks, convert_in_kernel=in_kernel, interpret=True, **kwargs))(
          xq.data, xq.scale_inv, b, b_scale, group_sizes)
  assert got.shape == (n, f) and got.dtype == jnp.float32
  sb_cols = np.repeat(_f64(wq.scale_inv), bnb, axis=1)[:, :f]  # [E, F, J]
  want, mag = _np_rows(_f64(xq.data), _f64(xq.scale_inv), _f64(wq.data), sb_cols, sizes,
                       interval)
  n_int = -(-k // interval)
  _assert_close(got, want, mag, interval + n_int + 1)
  assert np.all(np.asarray(got)[sum(sizes):] == 0)
  # The check discriminates: the weight of the next group is far outside the bound.
  wrong, _ = _np_rows(_f64(xq.data), _f64(xq.scale_inv), np.roll(_f64(wq.data), 1, axis=0),
                      np.roll(sb_cols, 1, axis=0), sizes, interval)
  assert np.max(np.abs(wrong - want) - (interval + n_int + 1) * U * mag) > 0

  xla = jax.jit(lambda *ops: ref.rows_reference(*ops, tile=16, **kwargs))(
      xq.data, xq.scale_inv, b, b_scale, group_sizes)
  _assert_close(got, xla, mag, interval + n_int + 1, factor=2)
  if not transpose_b:
    return
  y = _dense(_per_group(xq, sizes, 0, interval), wq)  # [E, longest group, F]
  start = 0
  for g, size in enumerate(sizes):
    rows = slice(start, start + size)
    _assert_close(got[rows], y[g, :size], mag[rows], interval + n_int + 1, factor=2)
    start += size


@pytest.mark.parametrize("b_block_n", [64, 1])
def test_rows_aligned_groups_same_bits_as_masked(b_block_n):
  """Groups of whole row tiles (``groups_aligned``: no row masks) give the masked kernel's
  bits, with one weight scale per two column blocks (a scalar per program: three scale
  blocks, the last partial) or per column; the rows past the groups (a partial tile) are
  zero, and every element is written. (The interpreter drops stores past the array, so a
  tail tile stored without its mask shows only on a GPU.)"""
  interval, sizes, extra, blocks = 32, [32, 0, 16, 48], 5, gsp.Blocks(m=16, n=32, k=32)
  rng = np.random.default_rng(11)
  n, k, f = sum(sizes) + extra, 64, 136
  xq = _quantize(_varied(rng, (n, k), interval), "e4m3", fp8jax.tile(interval))
  wq = _quantize(_varied(rng, (len(sizes), f, k), interval), "e4m3",
                 fp8jax.block((b_block_n, interval)))
  args = (xq.data, xq.scale_inv, wq.data, wq.scale_inv, jnp.asarray(sizes, jnp.int32))
  aligned, masked = jax.jit(lambda *ops: [gsp.grouped_scaled_matmul(
      *ops, transpose_b=True, interval=interval, b_block_n=b_block_n, blocks=blocks,
      groups_aligned=a, convert_in_kernel=True, interpret=True) for a in (True, False)])(*args)
  np.testing.assert_array_equal(aligned, masked)
  assert np.all(np.asarray(aligned)[sum(sizes):] == 0) and np.all(np.isfinite(aligned))
  sb_cols = np.repeat(_f64(wq.scale_inv), b_block_n, axis=1)[:, :f]  # [E, F, J]
  want, mag = _np_rows(_f64(xq.data), _f64(xq.scale_inv), _f64(wq.data), sb_cols, sizes,
                       interval)
  _assert_close(aligned, want, mag, interval + k // interval + 1)
  # FP8 dots: in the interpreter exact products summed in float32 (in XLA's order).
  fp8 = jax.jit(lambda *ops: gsp.grouped_scaled_matmul(
      *ops, transpose_b=True, interval=interval, b_block_n=b_block_n, blocks=blocks,
      groups_aligned=True, fp8_dots=True, interpret=True))(*args)
  _assert_close(fp8, want, mag, interval + k // interval + 1)


def _wgrad_operands(rng, sizes, extra, k, f, interval, fmt):
  n = sum(sizes) + extra
  xt = _quantize(_varied(rng, (k, n), interval), fmt, fp8jax.tile(interval))  # X^T [K, N]
  dyt = _quantize(_varied(rng, (f, n), interval), fmt, fp8jax.tile(interval))  # dY^T
  return xt, dyt


@pytest.mark.slow
def test_wgrad_unaligned_groups_match_numpy_reference():
  """Groups that start and end inside intervals (their scale tiles shared), empty groups,
  groups inside one interval, rows past the sum; K and F not whole blocks."""
  interval, sizes = 32, [0, 45, 7, 0, 60, 3]
  rng = np.random.default_rng(7)
  xt, dyt = _wgrad_operands(rng, sizes, 35, 40, 24, interval, "e4m3")
  group_sizes = jnp.asarray(sizes, jnp.int32)
  args = (xt.data, xt.scale_inv, dyt.data, dyt.scale_inv, group_sizes)
  got = jax.jit(lambda *ops: gsp.grouped_scaled_wgrad(
      *ops, interval=interval, blocks=gsp.Blocks(m=16, n=16, k=16), interpret=True))(*args)
  assert got.shape == (len(sizes), 40, 24) and got.dtype == jnp.float32
  want, mag = _np_wgrad(_f64(xt.data), _f64(xt.scale_inv), _f64(dyt.data),
                        _f64(dyt.scale_inv), sizes, interval)
  terms = interval + -(-sum(sizes) // interval) + 1
  _assert_close(got, want, mag, terms)
  assert np.all(np.asarray(got)[[0, 3]] == 0)
  xla = jax.jit(lambda *ops: ref.wgrad_reference(*ops, interval=interval))(*args)
  _assert_close(got, xla, mag, terms, factor=2)
  # The operands in the rows' layout (X [N, K], dY [N, F], scales [J, K], [J, F]): the
  # same products; the interpreter's float32 dot may sum a transposed tile in another
  # order, so to the reference's bound.
  rows_first = jax.jit(lambda *ops: gsp.grouped_scaled_wgrad(
      *[o.T for o in ops[:4]], ops[4], interval=interval, rows_first=True,
      blocks=gsp.Blocks(m=16, n=16, k=16), interpret=True))(*args)
  _assert_close(rows_first, want, mag, terms)
  assert np.all(np.asarray(rows_first)[[0, 3]] == 0)


@pytest.mark.slow
def test_wgrad_padded_groups_match_per_expert_gemm():
  """Groups padded to whole intervals (the layout of real kernels): with and without the
  row masks the same result, and each dW_g equals the dense GEMM of X_g^T and dY_g^T."""
  interval, sizes = 64, [128, 0, 64, 192]
  rng = np.random.default_rng(3)
  xt, dyt = _wgrad_operands(rng, sizes, 64, 48, 40, interval, "e4m3")
  args = (xt.data, xt.scale_inv, dyt.data, dyt.scale_inv, jnp.asarray(sizes, jnp.int32))
  run = jax.jit(lambda *ops: [gsp.grouped_scaled_wgrad(
      *ops, interval=interval, groups_aligned=aligned, blocks=gsp.Blocks(m=32, n=32, k=32),
      interpret=True) for aligned in (True, False)])
  aligned, masked = run(*args)
  want, mag = _np_wgrad(_f64(xt.data), _f64(xt.scale_inv), _f64(dyt.data),
                        _f64(dyt.scale_inv), sizes, interval)
  terms = interval + sum(sizes) // interval + 1
  _assert_close(aligned, want, mag, terms)
  rows_first = jax.jit(lambda *ops: [gsp.grouped_scaled_wgrad(
      *[o.T for o in ops[:4]], ops[4], interval=interval, groups_aligned=aligned,
      rows_first=True, blocks=gsp.Blocks(m=32, n=32, k=32), interpret=True)
      for aligned in (True, False)])(*args)
  np.testing.assert_array_equal(rows_first[0], rows_first[1])
  _assert_close(rows_first[0], want, mag, terms)  # as above: to the reference's bound
  fp8 = jax.jit(lambda *ops: gsp.grouped_scaled_wgrad(
      *[o.T for o in ops[:4]], ops[4], interval=interval, groups_aligned=True,
      rows_first=True, fp8_dots=True, blocks=gsp.Blocks(m=32, n=32, k=32), interpret=True)
  )(*args)
  _assert_close(fp8, want, mag, terms)
  np.testing.assert_array_equal(aligned, masked)
  assert np.all(np.asarray(aligned)[1] == 0)
  dw = _dense(_per_group(xt, sizes, 1, interval), _per_group(dyt, sizes, 1, interval))
  _assert_close(aligned, dw, mag, terms, factor=2)  # [E, K, F], empty groups included


def test_argument_errors():
  a = jnp.zeros((8, 128), jnp.float8_e4m3fn)
  sa = jnp.ones((8, 1), jnp.float32)
  w = jnp.zeros((2, 128, 16), jnp.float8_e4m3fn)
  sw = jnp.ones((2, 1, 1), jnp.float32)
  sizes = jnp.asarray([3, 5], jnp.int32)
  with pytest.raises(TypeError, match="8-bit floats or bfloat16"):
    gsp.grouped_scaled_matmul(a.astype(jnp.float32), sa, w, sw, sizes, interpret=True)
  with pytest.raises(ValueError, match="unsupported promotion interval 96"):
    gsp.grouped_scaled_matmul(a, sa, w, sw, sizes, interval=96, interpret=True)
  with pytest.raises(ValueError, match="must divide the interval"):
    gsp.grouped_scaled_matmul(a, sa, w, sw, sizes, interval=384,
                              blocks=gsp.Blocks(k=256), interpret=True)
  with pytest.raises(ValueError, match="scales must be"):
    gsp.grouped_scaled_matmul(a, sa, w, sw, sizes, interval=64, interpret=True)
  with pytest.raises(ValueError, match="contraction axis"):
    gsp.grouped_scaled_matmul(a, sa, w, sw, sizes, transpose_b=True, interpret=True)
  with pytest.raises(ValueError, match="fp8_dots needs E4M3 or E5M2 payloads of one format"):
    gsp.grouped_scaled_matmul(a, sa, w.astype(jnp.float8_e5m2), sw, sizes, fp8_dots=True,
                              interpret=True)
  with pytest.raises(ValueError, match="scales must be"):
    gsp.grouped_scaled_wgrad(a.T, sa.T, a.T, jnp.ones((128, 2)), sizes, interpret=True)
  with pytest.raises(ValueError, match=r"need a \[N, K\], b \[N, F\]"):
    gsp.grouped_scaled_wgrad(a, sa, a.T, sa, sizes, rows_first=True, interpret=True)
  with pytest.raises(ValueError, match="scales must be"):
    gsp.grouped_scaled_wgrad(a, sa, a, sa, sizes, rows_first=True, interpret=True)
