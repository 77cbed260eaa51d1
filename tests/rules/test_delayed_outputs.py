"""Delayed scaling on module outputs: the histories' update (the gradient with respect to
the state) against the amax pushes computed in NumPy, the first step against current
scaling, the outputs against the NumPy quantization, Linen, and the refused cases."""

from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.rules import Rule, Rules, delayed_init, delayed_scope, intercept
from tests.references import reference as ref
from tests.rules.conftest import LinenMLP, x_input

SPEC = fp8jax.QuantSpec(granularity=fp8jax.per_tensor(), scaling="delayed", history_len=3,
                        backward=fp8jax.QuantSpec(format="e5m2",
                                                  granularity=fp8jax.per_tensor(),
                                                  scaling="delayed", history_len=2))
"""E4M3 delayed forward (history 3), E5M2 delayed cotangent (history 2)."""
FWD_ONLY = SPEC.replace(backward=None, history_len=4)
CURRENT = fp8jax.QuantSpec(granularity=fp8jax.per_tensor())
"""FWD_ONLY with current scaling."""


def _linear(spec, rules=None):
  lin = nnx.Linear(8, 16, rngs=nnx.Rngs(0))
  return lin, rules_lib.quantize_model(lin, rules or Rules([Rule("", spec)]))


def _data(step):
  rng = np.random.default_rng(step)
  x = (rng.standard_normal((4, 8)) * (1 + step)).astype(np.float32)
  return x, rng.standard_normal((4, 16)).astype(np.float32)


def test_each_step_pushes_the_output_and_cotangent_amax_that_numpy_computes():
  lin, q = _linear(SPEC)
  state = delayed_init(q, jnp.zeros((4, 8)))
  assert jax.tree.map(jnp.shape, state) == {"": {0: {"fwd": (3,), "bwd": (2,)}}}
  graphdef, params = nnx.split(q, nnx.Param)
  w, b = (np.asarray(a, np.float64) for a in (lin.kernel[...], lin.bias[...]))

  def loss(p, s, x, c):
    with delayed_scope(s):
      return jnp.sum(nnx.merge(graphdef, p)(x) * c)

  step = jax.jit(jax.grad(loss, argnums=1))
  fwd, bwd = [0.0] * 3, [0.0] * 2
  for t in range(4):  # the forward history rolls over at the fourth step
    x, c = _data(t)
    state = step(params, state, x, c)
    fwd = [np.max(np.abs(x @ w + b))] + fwd[:-1]
    bwd = [float(np.max(np.abs(c)))] + bwd[:-1]  # the cotangent of sum(y * c) is c
    np.testing.assert_allclose(state[""][0]["fwd"], fwd, rtol=1e-6)
    np.testing.assert_array_equal(state[""][0]["bwd"], np.asarray(bwd, np.float32))


def test_the_first_step_is_current_scaling_and_later_ones_use_the_history():
  """fp8jax.quant.delayed: an empty history takes the tensor's own amax; then the history's
  max gives the scale (3x the tensor's amax here: other rounding)."""
  lin, q = _linear(FWD_ONLY)
  current = rules_lib.quantize_model(lin, Rules([Rule("", CURRENT)]))
  x, _ = _data(0)
  y = np.asarray(jax.jit(lambda v: lin(v))(x))
  amax = float(np.max(np.abs(y)))
  graphdef, params = nnx.split(q, nnx.Param)

  @jax.jit
  def run(p, s, v):
    with delayed_scope(s):
      return nnx.merge(graphdef, p)(v)

  empty = delayed_init(q, x)
  first = np.asarray(run(params, empty, x))
  np.testing.assert_array_equal(first, np.asarray(jax.jit(lambda v: current(v))(x)))
  np.testing.assert_array_equal(first, ref.ref_quantize(y, "e4m3", "tensor", (), ())[2])
  wide = {"": {0: {"fwd": jnp.asarray([0.0, 3 * amax, amax, 0.0], jnp.float32)}}}
  later = np.asarray(run(params, wide, x))
  want = ref.ref_quantize(y, "e4m3", "tensor", (), (), amax=np.float32(3 * amax))[2]
  np.testing.assert_array_equal(later, want)
  assert not np.array_equal(later, first)


def test_a_linen_module_output_reads_its_history_inside_intercept():
  model = LinenMLP()
  x = x_input()
  variables = model.init(jax.random.key(0), x)
  rules = Rules([Rule("fc0_in", FWD_ONLY)])
  _, inter = model.apply(variables, x, capture_intermediates=True)
  amax = float(np.max(np.abs(np.asarray(inter["intermediates"]["fc0_in"]["__call__"][0]))))

  def loss(params, s):
    with intercept(rules), delayed_scope(s):
      return jnp.sum(model.apply({"params": params}, x))

  with intercept(rules):
    state = delayed_init(lambda v: model.apply(variables, v), x)
  assert jax.tree.map(jnp.shape, state) == {"fc0_in": {0: {"fwd": (4,)}}}
  new = jax.jit(jax.grad(loss, argnums=1))(variables["params"], state)
  np.testing.assert_allclose(new["fc0_in"][0]["fwd"], [amax, 0, 0, 0], rtol=1e-6)
  assert "fc0_in  output [2,8,64]  e4m3 per-tensor delayed" in rules_lib.describe(model, rules, x)


class Twice(nnx.Module):
  def __init__(self, rngs):
    self.fc = nnx.Linear(8, 8, rngs=rngs)

  def __call__(self, x):
    return self.fc(self.fc(x))


def test_the_refused_cases_are_one_line_errors():
  lin, q = _linear(FWD_ONLY)
  x = jnp.ones((2, 8))
  good = delayed_init(q, x)
  twice = rules_lib.quantize_model(Twice(nnx.Rngs(0)), [Rule("fc", FWD_ONLY)])
  cases = [
      (lambda: q(x), r"^rule '', role output \(rules\[0\]\) puts delayed scaling on the output "
                     r"of module '', and no amax histories are given: run the model inside "
                     r"fp8jax.rules.delayed_scope"),
      (lambda: delayed_init(twice, x),
       r"^module 'fc' is called more than once in one forward pass, and rule 'fc', role "
       r"output \(rules\[0\]\) puts delayed scaling on its output"),
      (lambda: _run(q, {}, x), r"^the delayed-scaling state has no amax histories for module ''"),
      (lambda: _run(q, {"": {0: {"fwd": jnp.zeros(3)}}}, x),
       r"^the amax histories of module '' are \{'0/fwd': \[3\]\}, but .* needs "
       r"\{'0/fwd': \[4\]\}"),
      (lambda: _run(q, {**good, "fc": good[""]}, x),
       r"^delayed_scope: the state holds amax histories that no module output used: \['fc'\]"),
      (lambda: _run(q, good, x, jitted=True),
       r"^the amax histories of module '' are constants of a traced function"),
      (lambda: delayed_scope([]).__enter__(), r"^delayed_scope: the state must be a dict"),
  ]
  for call, match in cases:
    with pytest.raises((ValueError, TypeError), match=match) as info:
      call()
    assert "\n" not in str(info.value)


def _run(q, state, x, jitted=False):
  with delayed_scope(state):
    return jax.jit(lambda v: q(v))(x) if jitted else q(x)


class Outputs(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(4, name="fc")(x)


def test_a_linen_module_without_state_is_refused_naming_the_rule():
  model = Outputs()
  variables = model.init(jax.random.key(0), jnp.ones((2, 3)))
  with pytest.raises(ValueError, match=r"^rule 'fc', role output \(rules\[0\]\) puts delayed "
                                       r"scaling on the output of module 'fc'"):
    with intercept([Rule("fc", FWD_ONLY)]):
      model.apply(variables, jnp.ones((2, 3)))
