"""The jaxpr route's engine (fp8jax.rules.jaxpr_route): every GEMM on a parameter, whatever
code computes it, inside scan and remat too, bit for bit against an independent NumPy
reference and the hook route, with no leak between models."""

import functools

from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.gemm import recipes
from fp8jax.rules import Rule, Rules
from tests.references import reference as ref
from tests.rules.conftest import (
  NNX_RULES,
  B,
  K,
  LinenMLP,
  Net,
  T,
  V,
  as_fn,
  fresh,
  x_input,
)

TENSOR = recipes.recipe("fp8_tensor")


def _pow2(fmt):
  return fp8jax.QuantSpec(format=fmt, granularity=fp8jax.per_tensor(), scale_format="pow2",
                          pow2_rounding="floor")


EXACT = fp8jax.GemmConfig(roles=fp8jax.RoleSpecs(input=_pow2("e4m3"), weight=_pow2("e5m2"),
                                                 grad=_pow2("e5m2")))
"""Per-tensor power-of-two scales, E4M3 inputs, E5M2 weights and gradients. On the values
of :func:`_spread` every product of payloads is a multiple of one power of two and every
sum of up to 64 of them fits float32's 24 bits: the GEMMs are exact, in any order, so a
float64 reference gives the same bits."""
N = 8


def _spread(rng, shape, low):
  """Random signs, magnitudes uniform in [low, 1] x 3: per-tensor quantization keeps every
  payload within log2(1 / low) binades of the format's top (integers for E4M3 at low=1/16,
  multiples of 1024 for E5M2 at low=1/4)."""
  mag = rng.uniform(low, 1.0, shape)
  return (np.where(rng.random(shape) < 0.5, -mag, mag) * 3.0).astype(np.float32)


def _deq(x, fmt):
  """x quantized per tensor by the independent reference (tests/references/reference.py),
  float64."""
  return ref.ref_quantize(np.asarray(x, np.float32), fmt, "tensor", (), (),
                          scale_format="pow2", rounding="floor")[2].astype(np.float64)


_RNG = np.random.default_rng(0)
X, W, EMB, DY = (_spread(_RNG, (B, T, K), 1 / 16), _spread(_RNG, (K, N), 1 / 4),
                 _spread(_RNG, (V, K), 1 / 4), _spread(_RNG, (B, T, N), 1 / 4))


class OwnCode(nnx.Module):
  """GEMMs written in the model's own code, none behind a Flax hook."""

  def __init__(self, case):
    self.w = nnx.Param(jnp.asarray(W))
    self.emb = nnx.Param(jnp.asarray(EMB))
    self.case = case

  def __call__(self, x):
    w = self.w[...]
    return {"matmul_op": lambda: x @ self.w,
            "jnp.matmul": lambda: jnp.matmul(x, w),
            "jnp.dot": lambda: jnp.dot(x, w),
            "jnp.einsum": lambda: jnp.einsum("btk,kn->btn", x, w),
            "tied_head": lambda: x @ self.emb[...].T,
            "weight_left": lambda: jnp.transpose(  # lax.dot_general(w, x): [N, B, T]
                lax.dot_general(w, x, (((0,), (2,)), ((), ()))), (1, 2, 0)),
            }[self.case]()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["matmul_op", "jnp.matmul", "jnp.dot", "jnp.einsum",
                                  "tied_head", "weight_left"])
def test_own_code_gemms_equal_an_independent_reference_bit_for_bit(case):
  """Y = Q_in(X) Q_w(W), dX = Q_grad(dY) Q_w(W)^T, dW = Q_in(X)^T Q_grad(dY) in float64 on
  operands quantized by tests/references/reference.py; the weight takes the weight role even on the
  lhs (``weight_left``) and transposed (``tied_head``, W = emb^T)."""
  fn, params = as_fn(OwnCode(case))
  qfn = rules_lib.quantize_gemms(fn, Rules([Rule(".*", EXACT)]))
  y = qfn(params, jnp.asarray(X))
  g_params, g_x = jax.grad(lambda p, x: jnp.sum(qfn(p, x) * DY), argnums=(0, 1))(
      params, jnp.asarray(X))
  w = EMB.T if case == "tied_head" else W
  x_q, w_q, dy_q = _deq(X, "e4m3"), _deq(w, "e5m2"), _deq(DY, "e5m2")
  np.testing.assert_array_equal(y, np.einsum("btk,kn->btn", x_q, w_q).astype(np.float32))
  np.testing.assert_array_equal(g_x, np.einsum("btn,kn->btk", dy_q, w_q).astype(np.float32))
  g_w = g_params["emb"][...].T if case == "tied_head" else g_params["w"][...]
  np.testing.assert_array_equal(g_w, np.einsum("btk,btn->kn", x_q, dy_q).astype(np.float32))
  assert np.max(np.abs(np.asarray(y) - X @ w)) > 0.1  # quantization changed the product


# --- no leaks: a quantized model leaves an unquantized one in the process unchanged ----

class Mixed(nnx.Module):
  """A Flax layer (hooked) and GEMMs of its own code on one parameter."""

  def __init__(self, rngs):
    self.fc = nnx.Linear(K, K, rngs=rngs)
    self.w = nnx.Param(jax.random.normal(rngs.params(), (K, N)))

  def __call__(self, x):
    h = jax.nn.gelu(self.fc(x))
    return h @ self.w + jnp.dot(h, self.w[...]) + jnp.einsum("btk,kn->btn", h, self.w[...])


def _run(model_fn, jit):
  """Output and input gradient of a model built afresh by ``model_fn``, run op by op or
  jitted (a fresh function: no jit cache of the test's own)."""
  f = model_fn()

  def run(x):
    return f(x), jax.grad(lambda x: jnp.sum(jnp.sin(f(x))))(x)
  return (jax.jit(run) if jit else run)(jnp.asarray(X))


def _mixed():
  return fresh(Mixed)


def _plain(jit):
  return _run(_mixed, jit)


def _quantized(route, jit):
  rules = Rules([Rule(".*", TENSOR)])
  if route == "hook":
    return _run(lambda: rules_lib.quantize_model(_mixed(), rules), jit)
  fn, params = as_fn(_mixed())
  return _run(lambda: functools.partial(rules_lib.quantize_gemms(fn, rules), params), jit)


def _same(a, b):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@functools.cache
def _fresh_plain(jit):
  """The unquantized model's output and input gradient in a run with JAX's caches fresh
  (``jax.clear_caches``: no trace of a quantized model in them); once per process."""
  jax.clear_caches()
  return _plain(jit)


@pytest.mark.parametrize("jit", [True, pytest.param(False, marks=pytest.mark.slow)])
@pytest.mark.parametrize("route", ["hook", "jaxpr"])
@pytest.mark.parametrize("quantized_first", [False, True])
def test_a_quantized_model_does_not_leak_into_an_unquantized_one(quantized_first, route, jit):
  """In either order (the quantized model first, with JAX's caches fresh, or after the
  unquantized one), the unquantized model's output and gradient are those of a run with
  JAX's caches fresh."""
  want = _fresh_plain(jit)
  if quantized_first:
    jax.clear_caches()
    quantized = _quantized(route, jit)
  else:
    _same(_plain(jit), want)
    quantized = _quantized(route, jit)
  got = _plain(jit)
  _same(got, want)
  assert not np.array_equal(quantized[0], want[0])
  assert not np.array_equal(quantized[1], want[1])


# --- the route against the hooks, inside control flow, and with no rule ------------------

@pytest.mark.slow
def test_the_jaxpr_route_gives_the_hook_routes_bits_where_both_reach():
  """NNX layers (dot_general and einsum hooks) and Linen layers (intercept): one set of
  rules by either route gives the same outputs and gradients, bit for bit."""
  rules = Rules([r for r in NNX_RULES if r.role != "output"])
  model, x = Net(nnx.Rngs(0)), x_input()
  graphdef, params, rest = nnx.split(rules_lib.quantize_model(model, rules), nnx.Param, ...)
  fn, _ = as_fn(model)
  qfn = rules_lib.quantize_gemms(fn, rules)

  def grads(f, p):
    return jax.jit(jax.value_and_grad(lambda p: jnp.sum(jnp.sin(f(p)))))(p)
  _same(grads(lambda p: nnx.merge(graphdef, p, rest)(x), params),
        grads(lambda p: qfn(p, x), params))
  linen, linen_rules = LinenMLP(), Rules([Rule(r"fc\d_(in|out)", TENSOR),
                                          Rule("fc0_in", EXACT)])
  variables = linen.init(jax.random.key(0), x)

  def hooked(p):
    with rules_lib.intercept(linen_rules):
      return linen.apply({"params": p}, x)
  route = rules_lib.quantize_gemms(lambda p, x: linen.apply({"params": p}, x), linen_rules)
  _same(grads(hooked, variables["params"]), grads(lambda p: route(p, x), variables["params"]))


def _stacked(seed=0):
  rng = np.random.default_rng(seed)  # NumPy's: a jax.random sampler compiles per shape
  return {"layers": {"w": jnp.asarray(rng.standard_normal((3, K, K)) * 0.3, jnp.float32)},
          "head": {"kernel": jnp.asarray(rng.standard_normal((K, N)), jnp.float32)}}


def _layers(params, x, dot):
  """A scan over stacked layers, then a rematerialised head with ReLU (a custom_jvp)."""
  def body(h, w):
    return jax.nn.relu(dot(h, w)) + h, None
  h, _ = lax.scan(body, x, params["layers"]["w"])
  return jax.checkpoint(lambda h: jnp.tanh(dot(h, params["head"]["kernel"])))(h)


def test_gemms_inside_scan_and_remat_are_reached():
  """The route enters scan and remat: the same bits as the recipe placed by hand there."""
  x = jnp.asarray(X[0])
  hand = functools.partial(fp8jax.fp8_dot_general, dimension_numbers=(((1,), (0,)), ((), ())),
                           config=TENSOR)
  qfn = rules_lib.quantize_gemms(lambda p, x: _layers(p, x, jnp.matmul),
                                 Rules([Rule(".*", TENSOR)]))

  def grads(f):
    return jax.jit(jax.value_and_grad(lambda p: jnp.sum(jnp.sin(f(p)))))(_stacked())
  _same(grads(lambda p: qfn(p, x)), grads(lambda p: _layers(p, x, hand)))


def test_describe_lists_the_gemms_in_scan_and_remat():
  x = jnp.asarray(X[0])
  text = rules_lib.describe(lambda p, x: _layers(p, x, jnp.matmul), [Rule("layers", TENSOR)],
                            _stacked(), x)
  assert "layers/w  dot_general [3,16]x[16,16] in scan  recipe fp8_tensor  (rules 0)" in text
  assert ("head/kernel  dot_general [3,16]x[16,8] in remat  not quantized: no rule"
          in text.splitlines())


def test_no_rule_gives_the_functions_own_bits():
  """Unreplaced equations are bound as they are (a custom_jvp with its own rule too)."""
  fn = lambda p, x: _layers(p, x, jnp.matmul)  # noqa: E731
  qfn = rules_lib.quantize_gemms(fn, Rules(), strict=False)
  x = jnp.asarray(X[0])
  _same(jax.jit(jax.value_and_grad(lambda p: jnp.sum(qfn(p, x))))(_stacked()),
        jax.jit(jax.value_and_grad(lambda p: jnp.sum(fn(p, x))))(_stacked()))
