"""User models of the rule engine's tests, written here and never edited by it: an NNX MLP
with an einsum mixer (``Net``), a Linen MLP (``LinenMLP``) and a tied-embedding LM whose
attention uses its Linear's kernel directly (``TiedLM``); the test modules import them."""

import functools

from flax import linen as nn
from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

import fp8jax
from fp8jax.gemm import recipes
from fp8jax.rules import Rule, Rules

D, H = 32, 64
BLOCKWISE = recipes.recipe("fp32_blockwise")
TENSOR = recipes.recipe("fp8_tensor")
OUT_SPEC = fp8jax.preset("deepseek_v3")
W_SPEC = fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.per_tensor())
ODD = fp8jax.QuantSpec(granularity=fp8jax.block((2, 2), axes=(-4, -1)))  # fits no 2-3D operand


def hand_dot(config):
  """``fp8_dot_general`` with ``config``, as a ``dot_general=`` hook placed by hand."""
  return functools.partial(fp8jax.fp8_dot_general, config=config)


def x_input(shape=(2, 8, D)):
  # NumPy's normal: jax.random's compiles a sampler per shape
  return jnp.asarray(np.random.default_rng(1).standard_normal(shape), jnp.float32)


def assert_same(a, b):
  """Two pytrees of arrays, equal bit for bit."""
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


# --- a user's NNX model; `hand` puts fp8jax ops in by hand at chosen places ------------

class Block(nnx.Module):
  def __init__(self, rngs, dot1=lax.dot_general, dot2=lax.dot_general, out=None):
    self.fc1 = nnx.Linear(D, H, dot_general=dot1, rngs=rngs)
    self.fc2 = nnx.Linear(H, D, dot_general=dot2, rngs=rngs)
    self.out = out

  def __call__(self, x):
    y = x + self.fc2(jax.nn.gelu(self.fc1(x)))
    return y if self.out is None else fp8jax.fake_quant(y, self.out)


class Net(nnx.Module):
  def __init__(self, rngs, hand=None):
    hand = hand or {}
    self.blocks = nnx.List([Block(rngs, **hand.get(i, {})) for i in range(2)])
    self.mix = nnx.Einsum("btd,de->bte", (D, D), rngs=rngs,
                          einsum_op=hand.get("mix", jnp.einsum))
    self.head = nnx.Linear(D, 8, rngs=rngs)

  def __call__(self, x):
    for b in self.blocks:
      x = b(x)
    return self.head(self.mix(x))


NNX_RULES = Rules([
    Rule(r"blocks/\d+/fc\d", TENSOR),
    Rule(r"blocks/0/fc1", BLOCKWISE),                       # overrides the line above
    Rule(r"blocks/1/fc2", W_SPEC, role="weight"),
    Rule(r"blocks/1", OUT_SPEC),                            # role output (a QuantSpec)
    Rule(r"mix", BLOCKWISE, op="einsum"),
])


# --- a user's Linen model -------------------------------------------------------------

class LinenMLP(nn.Module):
  hand: tuple = ()  # ((name, config or spec), ...)

  @nn.compact
  def __call__(self, x):
    hand = dict(self.hand)
    for i in range(2):
      h = nn.Dense(H, name=f"fc{i}_in", dot_general=hand.get(f"fc{i}_in"))(x)
      y = x + nn.Dense(D, name=f"fc{i}_out", dot_general=hand.get(f"fc{i}_out"))(
          jax.nn.gelu(h))
      x = y if f"out{i}" not in hand else fp8jax.fake_quant(y, hand[f"out{i}"])
    return nn.Dense(8, name="head")(x)


# --- GEMMs in a model's own code: the jaxpr route and the reports -----------------------

B, T, K, V = 2, 3, 16, 8


class Attention(nnx.Module):
  """A layer whose QKV projection uses its Linear's kernel directly (as CanViT does)."""

  def __init__(self, rngs):
    self.qkv = nnx.Linear(K, 3 * K, rngs=rngs)
    self.out = nnx.Linear(K, K, rngs=rngs)

  def __call__(self, x):
    q, k, v = jnp.split(x @ self.qkv.kernel[...], 3, axis=-1)
    return self.out(jax.nn.softmax(q @ k.swapaxes(-1, -2)) @ v)


class TiedLM(nnx.Module):
  def __init__(self, rngs):
    self.embed = nnx.Embed(V, K, rngs=rngs)
    self.attn = Attention(rngs)
    self.norm = nnx.RMSNorm(K, rngs=rngs)

  def __call__(self, tokens):
    h = self.embed(tokens)
    h = self.norm(h + self.attn(h))
    return h @ self.embed.embedding[...].T


TOKENS = jax.ShapeDtypeStruct((B, T), jnp.int32)


def as_fn(model):
  """``(fn(params, x), params)``: an NNX model as a function of its parameters."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return (lambda p, x: nnx.merge(graphdef, p, rest)(x)), params


@functools.cache
def _template(cls):
  return cls(nnx.Rngs(0))


def fresh(cls):
  """A fresh ``cls(nnx.Rngs(0))``: a copy of one built once per process (a random init
  compiles a sampler per shape, and every ``jax.clear_caches`` would throw them away)."""
  return nnx.clone(_template(cls))
