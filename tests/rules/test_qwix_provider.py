"""fp8jax's recipes as a qwix provider: one rule through fp8jax.rules and through
qwix.quantize_model gives the same bits (outputs and gradients), NNX and Linen."""

import dataclasses

from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qwix  # the dev extra installs it

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.gemm import recipes
from fp8jax.rules import Rule, Rules
from fp8jax.rules import qwix_provider as qp

D = 32
TENSOR, BLOCKWISE = recipes.recipe("fp8_tensor"), recipes.recipe("fp32_blockwise")
RULES = Rules([Rule(r"blocks/\d+/fc\d", TENSOR), Rule(r"blocks/0/fc1", BLOCKWISE),
               Rule("mix", TENSOR, op="einsum"), Rule(r"blocks/1/fc2", None, role="gemm")])


class Block(nnx.Module):
  def __init__(self, rngs):
    self.fc1 = nnx.Linear(D, 2 * D, rngs=rngs)
    self.fc2 = nnx.Linear(2 * D, D, rngs=rngs)

  def __call__(self, x):
    return x + self.fc2(jax.nn.gelu(self.fc1(x)))


class Net(nnx.Module):
  def __init__(self, rngs):
    self.blocks = nnx.List([Block(rngs) for _ in range(2)])
    self.mix = nnx.Einsum("btd,de->bte", (D, D), rngs=rngs)
    self.head = nnx.Linear(D, 8, rngs=rngs)

  def __call__(self, x):
    for b in self.blocks:
      x = b(x)
    return self.head(self.mix(x))


def _x():
  return jax.random.normal(jax.random.key(1), (2, 8, D), jnp.float32) * 3


def _outputs_and_grads(model, x):
  graphdef, *state = nnx.split(model, nnx.Param, ...)

  def loss(params, rest):
    y = nnx.merge(graphdef, params, rest)(x)
    return jnp.sum(jnp.sin(y)), y

  (_, y), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(*state)
  return y, g


def _assert_same(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b) > 1
  for u, v in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.slow
def test_same_rules_through_fp8jax_and_qwix_give_the_same_bits_nnx():
  model, x = Net(nnx.Rngs(0)), _x()
  ours = _outputs_and_grads(rules_lib.quantize_model(model, RULES), x)
  theirs = _outputs_and_grads(qwix.quantize_model(model, qp.provider(RULES), x), x)
  _assert_same(ours, theirs)
  plain = _outputs_and_grads(model, x)
  assert not np.array_equal(ours[0], plain[0])  # the rules changed something


@pytest.mark.slow
def test_qwix_order_is_first_match_and_from_rules_reverses():
  q = qp.from_rules(RULES)
  assert [r.module_path for r in q] == ["blocks/1/fc2", "mix", "blocks/0/fc1",
                                         r"blocks/\d+/fc\d"]
  assert q[0].gemm is None and q[1].op_names == ("einsum",) and q[2].gemm == BLOCKWISE
  model, x = Net(nnx.Rngs(0)), _x()
  written = qp.provider([qp.rule(r"blocks/1/fc2"), qp.rule("mix", TENSOR, op_names=["einsum"]),
                         qp.rule(r"blocks/0/fc1", BLOCKWISE), qp.rule(r"blocks/\d+/fc\d", TENSOR)])
  _assert_same(_outputs_and_grads(qwix.quantize_model(model, written, x), x),
               _outputs_and_grads(rules_lib.quantize_model(model, RULES), x))


class LinenNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = x + nn.Dense(D, name="fc1")(x)
    return nn.Dense(8, name="head")(x)


@pytest.mark.slow
def test_same_rules_through_fp8jax_and_qwix_give_the_same_bits_linen():
  rules = Rules([Rule("fc1", BLOCKWISE), Rule("head", TENSOR)])
  model, x = LinenNet(), _x()
  variables = model.init(jax.random.key(0), x)

  def run(apply):
    def loss(v):
      y = apply(v, x)
      return jnp.sum(jnp.sin(y)), y
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(variables)

  def ours(v, x):
    with rules_lib.intercept(rules):
      return model.apply(v, x)

  qmodel = qwix.quantize_model(model, qp.provider(rules))
  _assert_same(run(ours), run(qmodel.apply))
  assert not np.array_equal(run(ours)[0][1], run(model.apply)[0][1])


class WeightLeft(nnx.Module):
  """A module whose dot_general takes the weight as its lhs: y[b, n] = sum_k w[n, k] x[b, k]."""

  def __init__(self, rngs):
    self.w = nnx.Param(jax.random.normal(rngs.params(), (16, D)))

  def __call__(self, x):
    return jax.lax.dot_general(self.w[...], x, (((1,), (1,)), ((), ()))).T


@pytest.mark.slow
def test_a_weight_on_the_left_gets_the_weight_role():
  """The provider swaps the operands so that fp8jax's rhs (weight role) is the weight."""
  spec_w = fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.per_tensor())
  config = TENSOR.replace(roles=dataclasses.replace(TENSOR.roles, weight=spec_w))
  model, x = WeightLeft(nnx.Rngs(0)), _x()[0]
  got = qwix.quantize_model(model, qp.provider([qp.rule(".*", config)]), x)(x)
  want = fp8jax.fp8_dot_general(x, model.w[...], (((1,), (1,)), ((), ())), config=config)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("make, error, message", [
    (lambda: qp.rule("a(", TENSOR), ValueError, r"rule 'a\(', role gemm: bad module_path"),
    (lambda: qp.rule("a", TENSOR, op_names=("matmul",)), ValueError, r"unknown op 'matmul'"),
    (lambda: qp.rule("a", "fp8"), TypeError, r"qwix rule 'a': gemm must be"),
    (lambda: qp.from_rules([Rule("a", fp8jax.preset("deepseek_v3"))]), ValueError,
     r"rule 'a', role output.*only role 'gemm'"),
    (lambda: qp.provider([qwix.QtRule(module_path="a")]), TypeError, r"takes fp8jax"),
])
def test_bad_qwix_rules_are_refused(make, error, message):
  with pytest.raises(error, match=message):
    make()


class OwnMatmul(nnx.Module):
  """GEMMs through jitted jax.numpy functions, whose traces JAX caches."""

  def __init__(self, rngs):
    self.w = nnx.Param(jax.random.normal(rngs.params(), (D, 16)))

  def __call__(self, x):
    return x @ self.w + jnp.matmul(x, self.w[...]) + jnp.dot(x, self.w[...])


@pytest.mark.slow
@pytest.mark.parametrize("quantized_first", [False, True])
def test_matmul_is_reached_and_nothing_leaks_in_either_order(quantized_first):
  """With JIT disabled in matched modules (the provider's default), ``@``, ``jnp.matmul``
  and ``jnp.dot`` are quantized whichever model ran first, with the bits of the jaxpr
  route, and an unquantized model run after a quantized one keeps its own bits."""
  x = _x()[0]
  rules = Rules([Rule(".*", TENSOR)])

  def plain():
    return OwnMatmul(nnx.Rngs(0))(x)

  def quantized():
    return qwix.quantize_model(OwnMatmul(nnx.Rngs(0)), qp.provider(rules), x)(x)

  jax.clear_caches()
  if quantized_first:
    got_q, got = quantized(), plain()
    jax.clear_caches()
    want = plain()
  else:
    want = plain()
    got_q, got = quantized(), plain()
  np.testing.assert_array_equal(got, want)
  graphdef, params, rest = nnx.split(OwnMatmul(nnx.Rngs(0)), nnx.Param, ...)
  route = rules_lib.quantize_gemms(lambda p, x: nnx.merge(graphdef, p, rest)(x), rules)
  np.testing.assert_array_equal(got_q, route(params, x))
  assert not np.array_equal(got_q, want)
