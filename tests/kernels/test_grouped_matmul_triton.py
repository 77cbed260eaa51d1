"""The Pallas grouped GEMM (interpreter on CPU) against a NumPy float64 loop over groups."""

import functools

from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.kernels import grouped_matmul_triton as gmp

SMALL = gmp.Blocks(m=16, n=16, k=16)


def reference(x, w, sizes, dy):
  """float64 loop: y[rows of g] = x @ w[g]; dx = dy @ w[g]^T; dw[g] = x_g^T dy_g."""
  x, w, dy = (np.asarray(a, np.float64) for a in (x, w, dy))
  y, dx, dw = np.zeros_like(dy), np.zeros_like(x), np.zeros_like(w)
  start = 0
  for g, size in enumerate(np.asarray(sizes)):
    rows = slice(start, start + int(size))
    y[rows] = x[rows] @ w[g]
    dx[rows] = dy[rows] @ w[g].T
    dw[g] = x[rows].T @ dy[rows]
    start += int(size)
  return y, dx, dw


def run(x, w, sizes, dy, blocks=SMALL):
  f = functools.partial(gmp.grouped_matmul, fwd_blocks=blocks, wgrad_blocks=blocks,
                        interpret=True)
  with jax.default_matmul_precision("highest"):
    y, vjp = jax.vjp(lambda a, b: f(a, b, jnp.asarray(sizes, jnp.int32)), x, w)
    return (y, *vjp(dy))


def _case(sizes, d, f, extra_rows=0, seed=0, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  n = int(sum(sizes)) + extra_rows
  x = jnp.asarray(rng.standard_normal((n, d)), dtype)
  w = jnp.asarray(rng.standard_normal((len(sizes), d, f)), dtype)
  dy = jnp.asarray(rng.standard_normal((n, f)), dtype)
  return x, w, dy


@pytest.mark.slow
@settings(max_examples=5)
@given(cuts=st.lists(st.integers(0, 60), min_size=3, max_size=3), d=st.sampled_from([24, 40]),
       seed=st.integers(0, 2**16))
def test_matches_float64_loop(cuts, d, seed):
  """Any group sizes of 60 rows (empty groups, partial tiles, rows past sum(sizes), which
  give zeros and no gradient), d and f not multiples of the blocks. Shapes are few, so
  that the interpreter compiles each once."""
  bounds = sorted(cuts)
  sizes = [bounds[0], bounds[1] - bounds[0], bounds[2] - bounds[1]]
  f = 64 - d
  x, w, dy = _case(sizes, d, f, 60 - bounds[2], seed)
  y, dx, dw = run(x, w, sizes, dy)
  ry, rdx, rdw = reference(x, w, sizes, np.where(np.arange(len(x))[:, None] < sum(sizes), dy, 0))
  np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(dx, rdx, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(dw, rdw, rtol=1e-5, atol=1e-4)
  assert np.all(np.asarray(y)[sum(sizes):] == 0)


@pytest.mark.slow
def test_bf16_operands_accumulate_in_float32():
  x, w, dy = _case([50, 0, 70], 96, 80, dtype=jnp.bfloat16)
  y, dx, dw = run(x, w, [50, 0, 70], dy, gmp.Blocks(m=32, n=32, k=32))
  assert y.dtype == dx.dtype == dw.dtype == jnp.bfloat16
  for out, ref in zip((y, dx, dw), reference(x, w, [50, 0, 70], dy)):
    err = np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref)
    assert err < 5e-3  # bf16 output rounding; a bf16 accumulator would be ~10x worse


def test_row_tiles_never_cross_groups():
  sizes = jnp.asarray([5, 0, 17, 16, 1], jnp.int32)
  # compiled whole, as the kernel's wrapper runs it (op by op, each operation compiles)
  row_tiles = jax.jit(gmp.row_tiles, static_argnums=(1, 2))
  group, start, end = (np.asarray(a) for a in row_tiles(sizes, 45, 8))
  assert len(group) == -(-45 // 8) + 5 + 1
  bounds = np.concatenate([[0], np.cumsum([5, 0, 17, 16, 1, 45 - 39])])
  covered = np.zeros(45, int)
  for g, s, e in zip(group, start, end):
    if e > s:
      assert bounds[g] <= s < e <= bounds[g + 1] and e - s <= 8
      covered[s:e] += 1
  np.testing.assert_array_equal(covered, 1)  # every row exactly once


def test_vmap_over_groups_of_rows():
  x, w, _ = _case([10, 20, 6], 24, 24)
  xs = jnp.stack([x, x[::-1]])
  sizes = jnp.asarray([[10, 20, 6], [0, 30, 6]], jnp.int32)
  f = functools.partial(gmp.grouped_matmul, fwd_blocks=SMALL, wgrad_blocks=SMALL,
                        interpret=True)
  with jax.default_matmul_precision("highest"):
    y = jax.jit(jax.vmap(f, in_axes=(0, None, 0)))(xs, w, sizes)
  for i in range(2):
    np.testing.assert_allclose(
        y[i], reference(xs[i], w, sizes[i], np.zeros((36, 24)))[0], rtol=1e-5, atol=1e-4)


def test_no_rows():
  x, w, dy = _case([0, 0], 8, 8)
  y, dx, dw = run(x, w, [0, 0], dy)
  assert y.shape == (0, 8) and dx.shape == (0, 8) and np.all(np.asarray(dw) == 0)


def test_bad_input_is_named():
  x, w, _ = _case([4, 4], 8, 8)
  with pytest.raises(ValueError, match="contraction axis"):
    gmp.grouped_matmul(x[:, :4], w, jnp.asarray([4, 4]))
  with pytest.raises(ValueError, match="group_sizes"):
    gmp.grouped_matmul(x, w, jnp.asarray([8]))
  with pytest.raises(TypeError, match="share a dtype"):
    gmp.grouped_matmul(x.astype(jnp.bfloat16), w, jnp.asarray([4, 4]))
  with pytest.raises(ValueError, match="power of two"):
    gmp.Blocks(m=48)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_lowers_for_triton():
  """The kernels lower to Triton custom calls for an H100 (no GPU needed)."""
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None,
                                       platform="cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  sds = jax.ShapeDtypeStruct
  args = (sds((512, 256), jnp.bfloat16), sds((4, 256, 96), jnp.bfloat16),
          sds((4,), jnp.int32))
  f = jax.jit(jax.value_and_grad(
      lambda x, w, s: jnp.sum(gmp.grouped_matmul(x, w, s, interpret=False)), argnums=(0, 1)))
  with jax.sharding.use_abstract_mesh(mesh):
    exported = jax.export.export(
        f, platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(*args)
  assert exported.mlir_module().count("xla.gpu.triton") == 3  # forward, Dgrad, Wgrad
