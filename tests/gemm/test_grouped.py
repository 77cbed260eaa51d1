"""The grouped FP8 GEMM against per-expert fp8_dot_general."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import grouped as grouped_gemm
from tests.gemm.conftest import nonempty_experts, ragged_case
from tests.helpers import assert_close


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["requant", "double", "scaling_aware"])
def test_matches_per_expert_dot_general(policy):
  """Ragged group sizes: Wgrad pads each group to whole 128-row tiles, so no tile spans two
  experts and every dW_e equals the dense GEMM on that expert's rows alone."""
  x, w, dy, sizes = ragged_case(sizes=(150, 0, 90, 128))
  cfg = fp8jax.GemmConfig(transpose=policy)
  y, vjp = jax.vjp(lambda a, b: grouped_gemm.fp8_ragged_dot(a, b, sizes, cfg), x, w)
  dx, dw = vjp(dy)
  dn = (((1,), (0,)), ((), ()))
  for e, rows in nonempty_experts(sizes, dw):
    ye, vjp_e = jax.vjp(lambda a, b: fp8jax.fp8_dot_general(a, b, dn, config=cfg),
                        x[rows], w[e])
    dxe, dwe = vjp_e(dy[rows])
    assert_close(y[rows], ye)
    assert_close(dx[rows], dxe)
    assert_close(dw[e], dwe)


@pytest.mark.slow
def test_bf16_mode_and_errors():
  x, w, dy, sizes = ragged_case(sizes=(50, 70, 8), seed=1)
  y = grouped_gemm.fp8_ragged_dot(x, w, sizes, fp8jax.gemm.dense.BF16)
  ref = jax.lax.ragged_dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), sizes,
                           preferred_element_type=jnp.float32)
  assert_close(y, ref)
  g = jax.grad(lambda b: jnp.sum(grouped_gemm.fp8_ragged_dot(x, b, sizes) ** 2))(w)
  assert np.all(np.isfinite(g))
  native = fp8jax.recipe("fp8_tensor").replace(fprop="fp8_native")
  with pytest.raises(ValueError, match="fp8_native is not available"):
    grouped_gemm.fp8_ragged_dot(x, w, sizes, native)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["requant", "scaling_aware"])
def test_blockwise_kernel_path_equals_the_xla_simulation(policy, monkeypatch):
  """On one GPU the FP32-accumulation grouped GEMM runs in the blockwise-scaled kernel
  (here interpreted): the same operands and scales as the XLA path, scaled per promotion
  interval instead of per element, so equal to float32 rounding. Ragged sizes (Wgrad on
  groups padded to whole tiles), an empty expert, rows past the sum."""
  x, w, dy, _ = ragged_case(sizes=(150, 0, 90), k=256, f=256)
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
