"""The padded group layout (fp8jax.gemm.padding) against a NumPy loop, and the MoE dispatch
that sorts straight into it for an FP8 grouped GEMM."""

import functools

from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import grouped, padding
from models import moe


def _loop_pad(x, sizes, multiple):
  """Each group copied row by row to the next multiple of ``multiple``; zeros elsewhere."""
  n_pad = len(x) + len(sizes) * (multiple - 1)
  n_pad = -(-n_pad // multiple) * multiple
  out = np.zeros((n_pad, x.shape[1]), x.dtype)
  src, dst = 0, 0
  for size in sizes:
    for r in range(size):
      out[dst + r] = x[src + r]
    src += size
    dst += -(-size // multiple) * multiple
  return out


@pytest.mark.slow
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
       spare=st.integers(0, 5), multiple=st.sampled_from([1, 4, 16, 128]))
@settings(max_examples=max(20, settings.default.max_examples // 2))  # a compilation each
def test_pad_groups_matches_a_loop(sizes, spare, multiple):
  rng = np.random.default_rng(len(sizes) + spare)
  x = rng.standard_normal((sum(sizes) + spare, 3)).astype(np.float32) + 1  # no zeros
  got, padded = padding.pad_groups(jnp.asarray(x), jnp.asarray(sizes, jnp.int32), multiple)
  np.testing.assert_array_equal(np.asarray(got), _loop_pad(x, sizes, multiple))
  np.testing.assert_array_equal(np.asarray(padded), [-(-s // multiple) * multiple
                                                      for s in sizes])
  _, real = padding.padded_rows(jnp.asarray(sizes, jnp.int32), len(x), got.shape[0], multiple)
  np.testing.assert_array_equal(np.asarray(real), np.any(np.asarray(got) != 0, axis=1))


def _dispatch_case(seed=0, t=48, k=2, e=5, d=256, f=128):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, e, (t, k))
  ids[:, 1] = (ids[:, 0] + 1 + rng.integers(0, e - 1, t)) % e  # two distinct experts
  weights = rng.random((t, k)).astype(np.float32)
  arrays = [rng.standard_normal((t, d)), rng.standard_normal((e, d, f)) * 0.05,
            rng.standard_normal((e, d, f)) * 0.05, rng.standard_normal((e, f, d)) * 0.05]
  x, gate, up, down = (jnp.asarray(a, jnp.float32) for a in arrays)
  return x, jnp.asarray(weights), jnp.asarray(ids, jnp.int32), gate, up, down


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["fp32_blockwise", "mxfp8"])
def test_dispatch_into_padded_groups_equals_padding_in_the_gemm(recipe):
  """The dispatch that sorts into groups padded to the Wgrad's token tiles gives the same
  output and gradients as unpadded groups that the GEMM pads itself."""
  cfg = fp8jax.gemm.recipes.recipe(recipe)
  multiple = grouped.group_multiple_of(cfg)
  assert multiple == {"fp32_blockwise": 128, "mxfp8": 32}[recipe]
  x, weights, ids, gate, up, down = _dispatch_case()

  def loss(layout, x, weights, gate, up, down):
    mm = functools.partial(grouped.fp8_ragged_dot, config=cfg, group_multiple=layout)
    out = moe.experts_dispatch(x, weights, ids, gate, up, down, grouped_matmul=mm,
                               group_multiple=layout)
    return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape))), out

  grad = jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4, 5), has_aux=True), static_argnums=0)
  (g_pad, out_pad), (g_own, out_own) = grad(multiple, x, weights, gate, up, down), grad(
      1, x, weights, gate, up, down)
  np.testing.assert_allclose(out_pad, out_own, rtol=1e-6, atol=1e-7)
  for a, b, name in zip(g_pad, g_own, ("x", "weights", "gate", "up", "down"), strict=True):
    assert np.any(np.asarray(b) != 0), name
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * np.abs(b).max(), err_msg=name)


def test_group_multiple_must_cover_the_wgrad_tiles():
  x, w = jnp.ones((256, 128)), jnp.ones((2, 128, 128))
  with pytest.raises(ValueError, match="multiple of the 128 rows"):
    grouped.fp8_ragged_dot(x, w, jnp.array([100, 100]), fp8jax.GemmConfig(), group_multiple=64)


@pytest.mark.slow
def test_padded_dispatch_through_the_blockwise_kernel(monkeypatch):
  """The same in the grouped blockwise-scaled kernel (interpreted): groups padded by the
  dispatch reach Fprop, Dgrad and Wgrad as aligned groups."""
  x, weights, ids, gate, up, down = _dispatch_case(t=24, e=3)

  def grads(layout, impl):
    cfg = fp8jax.GemmConfig(impl=impl)
    mm = functools.partial(grouped.fp8_ragged_dot, config=cfg, group_multiple=layout)
    loss = lambda *a: jnp.sum(moe.experts_dispatch(  # noqa: E731
        *a[:2], ids, *a[2:], grouped_matmul=mm, group_multiple=layout) ** 2)
    return jax.jit(jax.grad(loss, argnums=(0, 2, 3, 4)))(x, weights, gate, up, down)

  want = grads(128, "xla")
  calls = []
  kernel = grouped.grouped_scaled_pallas
  for name in ("grouped_scaled_matmul", "grouped_scaled_wgrad"):
    fn = getattr(kernel, name)
    monkeypatch.setattr(kernel, name, lambda *a, fn=fn, name=name, **k: (
        calls.append((name, k.get("groups_aligned"))), fn(*a, **k))[1])
  got = grads(128, "pallas")
  assert set(calls) == {("grouped_scaled_wgrad", True), ("grouped_scaled_matmul", True)}
  for a, b in zip(got, want, strict=True):  # float32 rounding, through the SwiGLU and combine
    err = np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max()
    assert err < 1e-4, err


def test_fused_gate_up_dispatch_equals_two_gemms():
  """The gate and up projections as one GEMM of width 2f give the output and gradients of
  two GEMMs (XLA's tiled grouped GEMM, float32 at the highest matmul precision)."""
  x, weights, ids, gate, up, down = _dispatch_case(1, f=64)

  def loss(fused, x, weights, gate, up, down):
    out = moe.experts_dispatch(x, weights, ids, gate, up, down, fuse_gate_up=fused)
    return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape))), out

  grad = jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4, 5), has_aux=True), static_argnums=0)
  with jax.default_matmul_precision("highest"):
    (g_fused, out_fused), (g_two, out_two) = (grad(True, x, weights, gate, up, down),
                                              grad(False, x, weights, gate, up, down))
  np.testing.assert_allclose(out_fused, out_two, rtol=1e-6, atol=1e-6)
  for a, b, name in zip(g_fused, g_two, ("x", "weights", "gate", "up", "down"), strict=True):
    assert np.any(np.asarray(b) != 0), name
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * np.abs(b).max(), err_msg=name)


def _spy(monkeypatch, module, name, calls, *keys):
  fn = getattr(module, name)
  monkeypatch.setattr(module, name, lambda *a, **k: (
      calls.append((name, *(k.get(key) for key in keys))), fn(*a, **k))[1])


@pytest.mark.slow
@pytest.mark.parametrize("mma", [False, True])
def test_padded_rows_quantized_once_for_both_gemms(mma, monkeypatch):
  """In the padded layout, X (forward) and dY (backward) are each quantized for both of
  their GEMMs in one kernel, and the forward pass keeps X^T's quantization for Wgrad: the
  same Y and dX bits as the path that quantizes each operand apart (XLA), dW to float32
  rounding (its kernel contracts transposed operands instead of the rows); with
  ``fp8_mma``, FP8 dots in Wgrad too, in either layout."""
  rng = np.random.default_rng(5)
  sizes = jnp.asarray([130, 0, 100], jnp.int32)
  n = padding.padded_count(int(sizes.sum()), 3, 128)
  x, dy = (jnp.asarray(rng.standard_normal((n, d)), jnp.bfloat16) for d in (256, 128))
  _, real = padding.padded_rows(sizes, int(sizes.sum()), n, 128)
  x, dy = x * real[:, None], dy * real[:, None]  # zero padding rows, as the dispatch has
  w = jnp.asarray(rng.standard_normal((3, 256, 128)) * 0.05, jnp.float32)
  cfg = fp8jax.recipe("fp32_blockwise_mma" if mma else "fp32_blockwise").replace(
      impl="pallas")

  def run(layout, rows=x, grads=dy, sizes=sizes):
    y, vjp = jax.vjp(lambda a, b: grouped.fp8_ragged_dot(a, b, sizes, cfg, layout), rows, w)
    return (y, *vjp(grads))

  calls = []
  _spy(monkeypatch, grouped.grouped_operands.tile_quant_pallas, "quantize_rows_and_columns",
       calls)
  _spy(monkeypatch, grouped.grouped_scaled_pallas, "grouped_scaled_wgrad", calls,
       "rows_first", "fp8_dots")
  got = run(128)
  assert calls == [("quantize_rows_and_columns",)] * 2 + [("grouped_scaled_wgrad", False, mma)]
  calls.clear()
  with monkeypatch.context() as m:
    m.setattr(grouped.grouped_operands, "one_pass", lambda *a: False)
    want = run(128)
  assert calls == [("grouped_scaled_wgrad", not mma, mma)]  # fp8_mma: transposed operands
  for g, r, what in zip(got, want, ("y", "dx", "dw"), strict=True):
    g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
    assert np.any(g != 0), what
    if what == "dw":
      np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6 * np.abs(r).max())
    else:
      np.testing.assert_array_equal(g, r, err_msg=what)
  calls.clear()
  keep = np.asarray(real)
  run(1, x[keep], dy[keep])  # unpadded rows: quantized apart, each GEMM its own
  assert calls == [("grouped_scaled_wgrad", not mma, mma)]
