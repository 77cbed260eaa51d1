"""The MoE grouped GEMM on GPUs (``fp8jax.kernels.grouped_gpu``), on CPU: the kernel chosen
per direction, the shape and ``impls`` checks, the Triton kernels (interpreted) that it
falls back to off Hopper, and the composition of directions with Mosaic stand-ins."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.gemm import grouped as grouped_gemm
from fp8jax.kernels import grouped_gpu, placement
from tests.kernels.conftest import grouped_problem

TOL = dict(rtol=2e-2, atol=0.15)  # bf16 outputs of sums of up to 128 products
ALL_MOSAIC = dict.fromkeys(grouped_gpu.DIRECTIONS, "mosaic")


def f32(a):
  return np.asarray(a, np.float32)


def _numpy_grouped(x, w, sizes):
  """y [N, f] float64: rows of group g times w[g]; rows past sum(sizes) zero."""
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  y, start = np.zeros((x.shape[0], w.shape[2])), 0
  for g, size in enumerate(np.asarray(sizes)):
    y[start:start + size] = x[start:start + size] @ w[g]
    start += size
  return y


@pytest.mark.slow
@pytest.mark.parametrize("impls", [("mosaic", "triton", "mosaic"), ("triton", "mosaic", "triton")])
def test_grouped_gpu_composes_directions(fake_kernels, impls):
  x, w, dy, sizes = grouped_problem(seed=3, n=24, d=128, f=128, e=3)
  impls = dict(zip(grouped_gpu.DIRECTIONS, impls))
  f = lambda x, w: grouped_gpu.grouped_matmul(x, w, sizes, impls=impls)  # noqa: E731
  ref = lambda x, w: grouped_gemm.padded_grouped_matmul(x, w, sizes)  # noqa: E731
  y, vjp = jax.vjp(f, x, w)
  y_ref, vjp_ref = jax.vjp(ref, *(a.astype(jnp.float32) for a in (x, w)))
  np.testing.assert_allclose(f32(y), y_ref, **TOL)
  for got, want in zip(vjp(dy), vjp_ref(dy.astype(jnp.float32))):
    np.testing.assert_allclose(f32(got), want, **TOL)
  with pytest.raises(ValueError, match="impls must map"):
    grouped_gpu.grouped_matmul(x, w, sizes, impls={"fwd": "cublas"})


def test_choose_falls_back_to_triton():
  x, w = (114688, 1280), (63, 1280, 896)
  assert grouped_gpu.choose(x, w, jnp.bfloat16, hopper=True) == grouped_gpu.PREFERRED
  assert set(grouped_gpu.choose(x, w, jnp.bfloat16, hopper=False).values()) == {"triton"}
  assert set(grouped_gpu.choose(x, (63, 1280, 864), jnp.bfloat16, hopper=True).values()) \
      == {"triton"}
  all_mosaic = dict.fromkeys(grouped_gpu.DIRECTIONS, "mosaic")
  assert grouped_gpu.choose(x, w, jnp.bfloat16, all_mosaic, hopper=True) == all_mosaic


def test_choose_falls_back_per_direction_on_the_shape_each_kernel_sees():
  """The Mosaic configs tile by 128 (outputs, wgrad's d) and 64 (contractions): d = 1216
  (19 x 64) suits the Fprop contraction only; f = 832 (13 x 64) the Dgrad contraction only."""
  n = 4096
  assert grouped_gpu.choose((n, 1216), (8, 1216, 896), jnp.bfloat16, ALL_MOSAIC,
                            hopper=True) == {"fwd": "mosaic", "dgrad": "triton",
                                             "wgrad": "triton"}
  assert grouped_gpu.choose((n, 1280), (8, 1280, 832), jnp.bfloat16, ALL_MOSAIC,
                            hopper=True) == {"fwd": "triton", "dgrad": "mosaic",
                                             "wgrad": "triton"}
  assert set(grouped_gpu.choose((n, 1280), (8, 1280, 896), jnp.float32, ALL_MOSAIC,
                                hopper=True).values()) == {"triton"}  # bf16/f16 only
  assert grouped_gpu.choose((n, 1280), (8, 1280, 896), jnp.float16,
                            hopper=True) == {"fwd": "mosaic", "dgrad": "triton",
                                             "wgrad": "mosaic"}


def test_choose_asks_whether_the_device_is_a_hopper_gpu(monkeypatch):
  x, w = (4096, 1280), (8, 1280, 896)
  assert set(grouped_gpu.choose(x, w, jnp.bfloat16, ALL_MOSAIC).values()) == {"triton"}  # CPU
  for cc, kernel in (((9, 0), "mosaic"), ((8, 9), "triton"), ((10, 0), "triton")):
    monkeypatch.setattr(placement, "compute_capability", lambda cc=cc: cc)
    assert set(grouped_gpu.choose(x, w, jnp.bfloat16, ALL_MOSAIC).values()) == {kernel}, cc


def test_grouped_matmul_names_the_shapes_it_cannot_take():
  x, w, sizes = jnp.zeros((8, 16)), jnp.zeros((2, 16, 32)), jnp.array([3, 5])
  with pytest.raises(ValueError, match=r"x \[N, d\].*got \(2, 8, 16\), \(2, 16, 32\) and \(2,\)"):
    grouped_gpu.grouped_matmul(x[None].repeat(2, 0), w, sizes)
  with pytest.raises(ValueError, match=r"got \(8, 16\), \(16, 32\) and \(2,\)"):
    grouped_gpu.grouped_matmul(x, w[0], sizes)
  with pytest.raises(ValueError, match=r"group_sizes \[E\]; got .* and \(3,\)"):
    grouped_gpu.grouped_matmul(x, w, jnp.array([3, 5, 0]))


@pytest.mark.parametrize("impls", [
    {"fwd": "cublas", "dgrad": "triton", "wgrad": "triton"},
    {"fwd": "triton", "dgrad": "triton"},
    {**dict.fromkeys(grouped_gpu.DIRECTIONS, "triton"), "bwd": "triton"},
], ids=["unknown-kernel", "missing-direction", "extra-direction"])
def test_grouped_matmul_refuses_impls_other_than_one_kernel_per_direction(impls):
  with pytest.raises(ValueError, match=r"impls must map \('fwd', 'dgrad', 'wgrad'\) to "
                                       r"'mosaic' or 'triton', got"):
    grouped_gpu.grouped_matmul(jnp.zeros((8, 16)), jnp.zeros((2, 16, 32)), jnp.array([3, 5]),
                               impls=impls)


@pytest.mark.slow
def test_off_gpu_every_direction_runs_the_interpreted_triton_kernel():
  """Default ``impls`` on the CPU: Triton in the interpreter; values and gradients against
  a float64 NumPy loop over the groups, with rows past the group total zero."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((24, 32)).astype(np.float32)
  w = rng.standard_normal((3, 32, 16)).astype(np.float32)
  dy = rng.standard_normal((24, 16)).astype(np.float32)
  sizes = np.array([5, 0, 12], np.int32)  # 17 of the 24 rows, an empty group
  f = lambda a, b: grouped_gpu.grouped_matmul(a, b, jnp.asarray(sizes))  # noqa: E731
  y, vjp = jax.vjp(f, jnp.asarray(x), jnp.asarray(w))
  assert y.shape == (24, 16) and y.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(y), _numpy_grouped(x, w, sizes), rtol=1e-5, atol=1e-4)
  assert np.all(np.asarray(y)[17:] == 0)
  dx, dw = vjp(jnp.asarray(dy))
  want_dx = _numpy_grouped(dy, np.swapaxes(w, 1, 2), sizes)
  starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
  want_dw = np.stack([x[s:s + n].T.astype(np.float64) @ dy[s:s + n]
                      for s, n in zip(starts, sizes)])
  np.testing.assert_allclose(np.asarray(dx), want_dx, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.asarray(dw), want_dw, rtol=1e-5, atol=1e-4)
  assert np.all(np.asarray(dw)[1] == 0)  # the empty group's weight gets no gradient
