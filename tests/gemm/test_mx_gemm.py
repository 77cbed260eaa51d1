"""MX / NVFP4 in the GEMM simulation: the Hadamard transform, the recipes, the grouped
GEMM's group padding, stochastic-rounding keys and the model policy's BF16 layers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import grouped, hadamard, padding, recipes
from fp8jax.quant import rounding_bits
from fp8jax.study.comparison import policies as policies_lib
from models import policy as policy_lib

DN = (((2,), (0,)), ((), ()))


def _sylvester(n):
  h = np.array([[1.0]])
  while h.shape[0] < n:
    h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
  return h


@pytest.mark.parametrize("n", [2, 16, 32])
def test_hadamard_is_orthogonal_and_signed_sylvester(n):
  q = hadamard.hadamard_matrix(n, "random", seed=3).astype(np.float64)
  np.testing.assert_allclose(q @ q.T, np.eye(n), atol=1e-6)
  # Rows are ±(Sylvester rows) / sqrt(n): the random signs flip whole rows only.
  ratio = np.round(q * np.sqrt(n) / _sylvester(n), 5)
  assert np.all(np.abs(ratio) == 1) and np.all(ratio == ratio[:, :1])
  assert np.any(ratio[:, 0] < 0) or n == 2


def test_hadamard_refuses_non_power_of_two():
  with pytest.raises(ValueError, match="power of two"):
    hadamard.hadamard_matrix(12)


def test_random_hadamard_pads_and_inverts():
  x = np.random.default_rng(0).standard_normal((3, 37)).astype(np.float32)
  y = np.asarray(hadamard.random_hadamard(jnp.asarray(x), 16, signs="random", seed=1,
                                         dtype="float32"), np.float64)
  assert y.shape == (3, 48)
  q = hadamard.hadamard_matrix(16, "random", 1).astype(np.float64)
  back = (y.reshape(3, 3, 16) @ q.T).reshape(3, 48)
  np.testing.assert_allclose(back[:, :37], x, atol=1e-5)
  np.testing.assert_allclose(back[:, 37:], 0, atol=1e-5)


def test_transform_leaves_the_wgrad_product_unchanged():
  """(X^T Q)(Q^T dY) = X^T dY: the transformed operands' product (the transform in
  float32, HIGHEST) agrees with the plain float64 product to float32 rounding."""
  rng = np.random.default_rng(1)
  xt = rng.standard_normal((24, 70)).astype(np.float32)  # [K, tokens]
  dyt = rng.standard_normal((20, 70)).astype(np.float32)  # [N, tokens]
  a = hadamard.random_hadamard(jnp.asarray(xt), 16, dtype="float32")
  b = hadamard.random_hadamard(jnp.asarray(dyt), 16, dtype="float32")
  got = np.asarray(jnp.einsum("kt,nt->nk", a, b, precision="highest"), np.float64)
  want = dyt.astype(np.float64) @ xt.astype(np.float64).T
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def _grads(cfg, x, w):
  def loss(x, w):
    return jnp.sum(fp8jax.fp8_dot_general(x, w, DN, config=cfg) ** 2)
  return jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)


def _fprop_weight(w, cfg):
  """Each expert's weight as the grouped Fprop quantizes it, dequantized: [E, F, K]."""
  return jax.vmap(grouped._deq)(grouped._weight_q(jnp.swapaxes(w, -1, -2), cfg.roles.weight))


def _dgrad_weight(w, cfg):
  """Each expert's weight as the grouped Dgrad quantizes it, dequantized, as [E, F, K]."""
  return jax.vmap(lambda w_e: grouped._deq(grouped._dgrad_weight_q(w_e, cfg)).T)(w)


def _rel(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


@pytest.fixture(scope="module")
def xw():
  x = jax.random.normal(jax.random.key(0), (2, 48, 64))
  w = jax.random.normal(jax.random.key(1), (64, 40)) * 0.1
  return x, w


@pytest.mark.slow
def test_recipes_order_by_width(xw):
  """Every recipe runs (finite gradients) and the error grows as the format narrows."""
  x, w = xw
  ref = _grads(fp8jax.GemmConfig(fprop="bf16", dgrad="bf16", wgrad="bf16"), x, w)
  err = {}
  for name, cfg in recipes.RECIPES.items():
    g = _grads(cfg, x, w)
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in g), name
    err[name] = _rel(g[1], ref[1])
  assert max(err["mxfp8"], err["fp32_blockwise"]) < 0.1
  assert min(err["mxfp4"], err["nvfp4"], err["nvfp4_recipe"]) > 2 * err["mxfp8"]


@pytest.mark.slow
def test_two_level_output_against_float64(xw):
  """The NVFP4 Fprop equals the float64 product of the dequantized operands (the tensor
  levels enter as the GEMM's alpha)."""
  x, w = xw
  cfg = recipes.recipe("nvfp4")
  y = fp8jax.fp8_dot_general(x, w, DN, config=cfg)
  xq = fp8jax.dequantize(fp8jax.quantize(x.reshape(96, 64), cfg.roles.input), jnp.float32)
  wq = fp8jax.dequantize(fp8jax.quantize(w.T, cfg.roles.weight), jnp.float32)
  want = np.asarray(xq, np.float64) @ np.asarray(wq, np.float64).T
  np.testing.assert_allclose(np.asarray(y).reshape(96, 40), want, rtol=1e-5,
                             atol=1e-5 * np.abs(want).max())


@pytest.mark.slow
def test_stochastic_gemm_is_deterministic_and_keyed_by_content(xw):
  x, w = xw
  cfg = recipes.recipe("nvfp4_recipe")
  g1, g2 = _grads(cfg, x, w), _grads(cfg, x, w)
  assert all(bool(jnp.array_equal(a, b)) for a, b in zip(g1, g2))
  k1 = jax.random.key_data(rounding_bits.content_key(x, 1))
  assert not np.array_equal(k1, jax.random.key_data(rounding_bits.content_key(x, 2)))
  assert not np.array_equal(k1, jax.random.key_data(rounding_bits.content_key(x * 1.5, 1)))


def test_recipe_validation():
  with pytest.raises(ValueError, match="power of two"):
    fp8jax.GemmConfig(wgrad_hadamard=12)
  with pytest.raises(ValueError, match="requant"):
    fp8jax.GemmConfig(wgrad_hadamard=16, transpose="double")
  with pytest.raises(ValueError, match="fp8_native"):
    fp8jax.GemmConfig(roles=recipes.recipe("nvfp4").roles, fprop="fp8_native")
  with pytest.raises(ValueError, match="unknown GEMM recipe"):
    recipes.recipe("fp3")


def test_pad_groups_keeps_each_expert_product():
  rng = np.random.default_rng(2)
  sizes = jnp.array([5, 0, 19, 7], jnp.int32)
  x = jnp.asarray(rng.standard_normal((33, 6)), jnp.float32)  # 31 routed rows + 2 spare
  dy = jnp.asarray(rng.standard_normal((33, 4)), jnp.float32)
  xp, padded = padding.pad_groups(x, sizes, 16)
  dyp, _ = padding.pad_groups(dy, sizes, 16)
  assert xp.shape[0] % 16 == 0 and list(np.asarray(padded)) == [16, 0, 32, 16]
  starts = np.concatenate([[0], np.cumsum(np.asarray(sizes))])
  pstarts = np.concatenate([[0], np.cumsum(np.asarray(padded))])
  for e in range(4):
    rows = slice(starts[e], starts[e + 1])
    prow = slice(pstarts[e], pstarts[e + 1])
    np.testing.assert_array_equal(np.asarray(xp)[prow][: int(sizes[e])], np.asarray(x)[rows])
    assert np.all(np.asarray(xp)[prow][int(sizes[e]):] == 0)
    # The transform stays inside the group: the per-expert product is unchanged.
    a = hadamard.random_hadamard(xp[prow].T, 16, dtype="float32")
    b = hadamard.random_hadamard(dyp[prow].T, 16, dtype="float32")
    got = np.asarray(jnp.einsum("kt,nt->kn", a, b, precision="highest"), np.float64)
    want = np.asarray(x, np.float64)[rows].T @ np.asarray(dy, np.float64)[rows]
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.slow
def test_grouped_recipes_and_same_weight_in_fprop_and_dgrad():
  x = jax.random.normal(jax.random.key(2), (40, 32))
  w = jax.random.normal(jax.random.key(3), (3, 32, 48)) * 0.1
  sizes = jnp.array([17, 3, 20], jnp.int32)
  for name in ("mxfp8", "nvfp4_recipe"):
    cfg = recipes.recipe(name)
    g = jax.jit(jax.grad(lambda x, w, cfg=cfg: jnp.sum(
        grouped.fp8_ragged_dot(x, w, sizes, cfg) ** 2), argnums=(0, 1)))(x, w)
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in g), name
  cfg = recipes.recipe("nvfp4_recipe")  # 16x16 weight blocks: one quantized weight
  fprop, dgrad = _fprop_weight(w, cfg), _dgrad_weight(w, cfg)
  np.testing.assert_array_equal(np.asarray(fprop), np.asarray(dgrad))
  mx = recipes.recipe("mxfp8")  # 1x32 tiles along each GEMM's own contraction axis
  w = w * 2.0 ** (jnp.arange(48) % 7)  # tiles of rows and of columns in other binades
  fprop, dgrad = _fprop_weight(w, mx), _dgrad_weight(w, mx)
  assert not np.array_equal(np.asarray(fprop), np.asarray(dgrad))


def test_policy_recipe_layers():
  pol = policy_lib.parse_policy("gemm:nvfp4_recipe")
  assert pol.gemm == recipes.recipe("nvfp4_recipe") and pol.bf16_tail_layers(9) == 1
  assert pol.at_layer(7, 9).gemm is not None and pol.at_layer(8, 9).gemm is None
  assert policy_lib.parse_policy("gemm:nvfp4_recipe").bf16_tail_layers(28) == 4
  part = policy_lib.parse_policy("gemm:mxfp8@0-1")
  assert part.at_layer(1, 3).gemm is not None and part.at_layer(2, 3).gemm is None
  with pytest.raises(ValueError, match="names layer 5"):
    policy_lib.parse_policy("gemm:mxfp8@5").check_layers(3)
  with pytest.raises(ValueError, match="two GEMM recipes"):
    policy_lib.parse_policy("gemm:mxfp8+gemm:nvfp4")
  assert set(policies_lib.GRIDS["formats"](9)) == {
      "fp8_tensor", "fp8_blockwise", "mxfp8", "mxfp4", "nvfp4", "nvfp4_recipe"}
  for expr in policies_lib.GRIDS["formats"](9).values():
    policy_lib.parse_policy(expr)


@pytest.mark.slow
def test_nvfp4_recipe_ablations_each_drop_one_element(xw):
  """Each ablation of the NVFP4 recipe differs from it in its one element, and that element
  is active: its gradients differ from the full recipe's."""
  full = recipes.recipe("nvfp4_recipe")
  nvfp4 = recipes.recipe("nvfp4").roles.input
  assert recipes.recipe("nvfp4_recipe_no_rht") == full.replace(wgrad_hadamard=0)
  assert recipes.recipe("nvfp4_recipe_no_2d").roles.weight == nvfp4
  assert recipes.recipe("nvfp4_recipe_no_sr").roles.grad == nvfp4
  for name in ("nvfp4_recipe_no_2d", "nvfp4_recipe_no_sr"):
    cfg = recipes.recipe(name)
    assert cfg.wgrad_hadamard == full.wgrad_hadamard and sum(
        cfg.roles.spec(r) != full.roles.spec(r) for r in ("input", "weight", "grad")) == 1
  tails = {n: policy_lib.parse_policy(f"gemm:{n}").gemm_bf16_tail
           for n in ("nvfp4_recipe", "nvfp4_recipe_no_tail", "nvfp4_recipe_no_sr")}
  assert tails == {"nvfp4_recipe": 0.16, "nvfp4_recipe_no_tail": 0.0,
                   "nvfp4_recipe_no_sr": 0.16}
  x, w = xw
  ref = _grads(full, x, w)
  for name in ("nvfp4_recipe_no_rht", "nvfp4_recipe_no_2d", "nvfp4_recipe_no_sr"):
    g = _grads(recipes.recipe(name), x, w)
    assert any(not bool(jnp.array_equal(a, b)) for a, b in zip(g, ref)), name
  mx = recipes.recipe("mxfp8_ocp").roles.input
  assert mx.pow2_rounding != recipes.recipe("mxfp8").roles.input.pow2_rounding
