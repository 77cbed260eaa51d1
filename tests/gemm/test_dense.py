"""The simulated FP8 dot_general: forward, custom VJP wiring, configs, integrations."""

from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import accumulate
from fp8jax.gemm import dense as gemm
from tests.helpers import assert_close

DN = (((2,), (0,)), ((), ()))  # x [B, T, K] . w [K, N]


def _xw(seed=0, b=2, t=48, k=300, n=200):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((b, t, k)) * 2.0, jnp.float32)
  w = jnp.asarray(rng.standard_normal((k, n)) * 0.05, jnp.float32)
  dy = jnp.asarray(rng.standard_normal((b, t, n)) * 1e-3, jnp.float32)
  return x, w, dy


def _deq(x, spec):
  return fp8jax.dequantize(fp8jax.quantize(x, spec), jnp.float32)


def _hi(a, b, subscripts):
  return jnp.einsum(subscripts, a, b, precision=lax.Precision.HIGHEST)


@pytest.mark.slow
@pytest.mark.parametrize("transpose_policy", ["requant", "double", "scaling_aware"])
def test_custom_vjp_matches_grad_on_dequantized_operands(transpose_policy):
  x, w, dy = _xw()
  cfg = gemm.GemmConfig(transpose=transpose_policy)  # FP32 accumulation
  r = cfg.roles
  y, vjp = jax.vjp(lambda a, b: gemm.fp8_dot_general(a, b, DN, config=cfg), x, w)
  dx, dw = vjp(dy)
  # Forward: Q_in(X) . Q_w(W); the weight spec applies to W^T [N, K] (contraction last).
  x_d = _deq(x.reshape(-1, 300), r.input)
  w_d = _deq(w.T, r.weight).T
  assert_close(y.reshape(-1, 200), _hi(x_d, w_d, "mk,kn->mn"))
  # Dgrad through jax.grad with Q_grad(dY) and Q_w(W) in place of dY and W.
  dy2 = dy.reshape(-1, 200)
  dy_d = _deq(dy2, r.grad)
  dx_ref = jax.grad(lambda a: jnp.sum(dy_d * _hi(a, w_d, "mk,kn->mn")))(x.reshape(-1, 300))
  assert_close(dx.reshape(-1, 300), dx_ref)
  # Wgrad: X^T and dY^T quantized along M (tiles along the contraction), by the policy.
  xt_q = fp8jax.gemm.transpose.transposed(x.reshape(-1, 300), fp8jax.quantize(x.reshape(-1, 300),
                                     r.input), r.input, transpose_policy)
  dyt_q = fp8jax.gemm.transpose.transposed(dy2, fp8jax.quantize(dy2, r.grad), r.grad,
                                      transpose_policy)
  x_t = fp8jax.dequantize(xt_q, jnp.float32).T
  dy_t = fp8jax.dequantize(dyt_q, jnp.float32).T
  dw_ref = jax.grad(lambda b: jnp.sum(dy_t * _hi(x_t, b, "mk,kn->mn")))(w)
  assert_close(dw, dw_ref)


@pytest.mark.slow
def test_deepgemm_acceptance_against_bf16():
  """DeepGEMM's check 1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3 for the blockwise recipe."""
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((128, 1024)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((1024, 128)), jnp.bfloat16)
  dn = (((1,), (0,)), ((), ()))
  y = gemm.fp8_dot_general(x, w, dn, config=gemm.HOPPER_BLOCKWISE,
                           preferred_element_type=jnp.float32)
  ref = jnp.dot(x, w, preferred_element_type=jnp.float32)
  y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
  diff = 1 - 2 * np.sum(y * ref) / np.sum(y * y + ref * ref)
  assert 1e-5 < diff < 1e-3


@pytest.mark.slow
def test_directions_are_independent_and_bf16_matches_lax():
  x, w, dy = _xw(1, k=256, n=128)
  def grads(cfg):
    _, vjp = jax.vjp(lambda a, b: gemm.fp8_dot_general(a, b, DN, config=cfg), x, w)
    return vjp(dy)
  bf16_y = gemm.fp8_dot_general(x, w, DN, config=gemm.BF16)
  lax_y = lax.dot_general(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), DN,
                          preferred_element_type=jnp.float32)
  np.testing.assert_array_equal(bf16_y, lax_y)
  all_bf16 = grads(gemm.BF16)
  mixed = grads(gemm.GemmConfig(fprop="fp8", dgrad="bf16", wgrad="fp8"))
  all_fp8 = grads(gemm.GemmConfig())
  np.testing.assert_array_equal(mixed[0], all_bf16[0])  # dgrad in BF16
  np.testing.assert_array_equal(mixed[1], all_fp8[1])   # wgrad in FP8
  assert not np.array_equal(all_fp8[0], all_bf16[0])


@pytest.mark.slow
def test_native_fp8_matches_simulation_with_per_tensor_scales():
  x, w, dy = _xw(2, k=256, n=128)
  tensor = fp8jax.QuantSpec(granularity=fp8jax.per_tensor())
  roles = fp8jax.RoleSpecs(tensor, tensor, tensor.replace(format="e5m2"))
  sim = gemm.GemmConfig(roles=roles)
  native = sim.replace(fprop="fp8_native", dgrad="fp8_native", wgrad="fp8_native")
  out = {}
  for name, cfg in (("sim", sim), ("native", native)):
    y, vjp = jax.vjp(lambda a, b, c=cfg: gemm.fp8_dot_general(a, b, DN, config=c), x, w)
    out[name] = (y, *vjp(dy))
  # On a GPU the real FP8 GEMM accumulates in limited precision (~1e-4 of the range on
  # an H100); a wrong scale or role would be off by percents.
  for a, b in zip(out["sim"], out["native"]):
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-3 * float(jnp.max(jnp.abs(a))))


@pytest.mark.slow
def test_expert_einsum_uses_lhs_as_input_role():
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.standard_normal((3, 20, 256)), jnp.float32)  # experts, tokens, K
  w = jnp.asarray(rng.standard_normal((3, 256, 96)) * 0.1, jnp.float32)
  cfg = gemm.GemmConfig(roles=fp8jax.RoleSpecs(
      input=fp8jax.QuantSpec(granularity=fp8jax.tile(128)),
      weight=fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.block((128, 128))),
      grad=fp8jax.QuantSpec(granularity=fp8jax.tile(128))))
  y = gemm.fp8_einsum("egk,ekn->egn", x, w, config=cfg)
  direct = gemm.fp8_dot_general(x, w, (((2,), (1,)), ((0,), (0,))), config=cfg)
  assert_close(y, direct)
  # Per expert, the 2-D product with that expert's weight (equal up to float32 summation
  # order, which a GPU may change between batched and single GEMMs).
  for e in range(3):
    assert_close(y[e], gemm.fp8_dot_general(x[e], w[e], (((1,), (0,)), ((), ())), config=cfg))
  gx, gw = jax.grad(lambda a, b: jnp.sum(gemm.fp8_einsum("egk,ekn->egn", a, b,
                                                         config=cfg) ** 2), (0, 1))(x, w)
  assert gx.shape == x.shape and gw.shape == w.shape and np.all(np.isfinite(gw))


@pytest.mark.slow
def test_flax_nnx_linear_dot_general():
  layer = nnx.Linear(256, 64, rngs=nnx.Rngs(0),
                     dot_general=gemm.dot_general_fn(gemm.HOPPER_BLOCKWISE))
  x = jnp.asarray(np.random.default_rng(5).standard_normal((4, 256)), jnp.float32)
  want = gemm.fp8_dot_general(x, layer.kernel[...], (((1,), (0,)), ((), ())),
                              config=gemm.HOPPER_BLOCKWISE) + layer.bias[...]
  np.testing.assert_array_equal(layer(x), want)


@pytest.mark.parametrize("kwargs,match", [
    (dict(fprop="fp16"), "unknown fprop precision"),
    (dict(transpose="free"), "unknown transpose policy"),
    (dict(dgrad="fp8_native"), "dgrad=fp8_native needs per-tensor scales"),
    (dict(roles=fp8jax.deepseek_v3_roles().replace_all(
        granularity=fp8jax.per_tensor(), scaling="delayed")), "supports current scaling"),
    (dict(accumulation="hopper"), "accumulation must be"),
])


def test_invalid_configs(kwargs, match):
  with pytest.raises((ValueError, TypeError), match=match):
    gemm.GemmConfig(**kwargs)


def test_shape_errors():
  with pytest.raises(ValueError, match="contracting dims differ"):
    gemm.fp8_dot_general(jnp.ones((4, 8)), jnp.ones((9, 3)), (((1,), (0,)), ((), ())))


@pytest.mark.slow
def test_accumulation_modes_plug_in():
  x, w, _ = _xw(6, b=1, t=16, k=512, n=16)
  ys = {a.describe(): gemm.fp8_dot_general(x, w, DN, config=gemm.GemmConfig(accumulation=a))
        for a in (accumulate.FP32, accumulate.HOPPER)}
  a, b = ys.values()
  assert not np.array_equal(a, b)
  np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-3)


def test_hopper_blockwise_is_the_named_recipe_and_deepseek_v3_its_alias():
  assert gemm.HOPPER_BLOCKWISE == fp8jax.recipe("hopper_blockwise")
  assert gemm.DEEPSEEK_V3 is gemm.HOPPER_BLOCKWISE
