"""Delayed (per-tensor, amax-history) scaling as explicit functional state.

A history is a float32 vector ``[history_len]``; entry 0 is the most recent amax and
all zeros means "nothing recorded yet". At each step the tensor is quantized with the
scale derived from the history of *previous* steps, then its own amax is pushed in.

First step: when the selected history amax is 0 (an empty history), the tensor's own
amax is used instead, so the first step behaves like current scaling rather than
quantizing with an arbitrary scale.

Two ways to carry the state:

1. Explicitly, state in / state out::

     qt, history = fp8jax.quantize_and_update(x, spec, history)

2. Through ``jax.grad`` ("overwrite with gradient"): ``fake_quant(x, spec, state)``
   returns the updated :class:`DelayedState` (forward and cotangent histories) as the
   gradient with respect to ``state``. Replace the state by that gradient after the
   step. When one state is used more than once in the differentiated function, wrap
   it ONCE with :func:`max_combined` first, so that JAX combines the updates of the
   different uses with ``max`` instead of summing them::

     def loss(params, fp8_state):
       st = delayed.max_combined(fp8_state)
       y = fake_quant(x1, spec, st) + fake_quant(x2, spec, st)
       ...
     grads, new_fp8_state = jax.grad(loss, argnums=(0, 1))(params, fp8_state)

   A state that the function never uses gets an all-zero gradient: only overwrite
   states that were used.

   Limits of the max-combining dtype (Flax's ``fp32_max_grad``): the marked state must
   not cross a nested ``jax.jit`` or ``jax.checkpoint`` boundary (JAX cannot pass the
   dtype through them; ``lax.scan`` works), and calling ``max_combined`` separately
   inside each wrapped call sums the updates again. Under ``jax.vmap`` one state shared
   by the batch receives the SUM over the batch: compute the batch amax outside
   ``vmap`` instead. Use the explicit form (1) in those settings.
"""

from __future__ import annotations

import dataclasses

import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.numerics import arguments, blocks, scales
from fp8jax.numerics import spec as spec_lib


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DelayedState:
  """Amax histories of one ``fake_quant`` site.

  Attributes:
    fwd: history of the forward tensor, or None when it uses current scaling.
    bwd: history of the cotangent, or None when it is not delayed-scaled.
  """

  fwd: jax.Array | None = None
  bwd: jax.Array | None = None


def init_history(spec: spec_lib.QuantSpec) -> jax.Array:
  """An empty history (all zeros) of ``spec.history_len`` float32 entries."""
  return jnp.zeros((spec.history_len,), jnp.float32)


def init_state(spec: spec_lib.QuantSpec) -> DelayedState:
  """The empty state that ``fake_quant(x, spec, state)`` expects for ``spec``."""
  spec = arguments.quant_spec(spec, "spec", "init_state")
  bwd = spec.backward
  return DelayedState(
      fwd=init_history(spec) if spec.scaling == "delayed" else None,
      bwd=init_history(bwd) if bwd is not None and bwd.scaling == "delayed" else None)


def needs_state(spec: spec_lib.QuantSpec) -> bool:
  """Whether ``spec`` or its backward spec uses delayed scaling."""
  bwd = spec.backward
  return spec.scaling == "delayed" or (bwd is not None and bwd.scaling == "delayed")


def check_history(history: jax.Array, spec: spec_lib.QuantSpec, role: str) -> None:
  """Raises a clear error when ``history`` does not fit ``spec``."""
  if history is None:
    raise ValueError(
        f"the {role} spec ({spec.describe()}) uses delayed scaling and needs an amax "
        "history; build one with fp8jax.quant.delayed.init_history(spec) or init_state(spec)")
  if tuple(history.shape) != (spec.history_len,):
    raise ValueError(
        f"the {role} amax history has shape {tuple(history.shape)}, but the spec asks "
        f"for history_len={spec.history_len}")


def history_amax(history: jax.Array, spec: spec_lib.QuantSpec) -> jax.Array:
  """The amax selected from a float32 history: its max or most recent entry."""
  if spec.history_reduce == "max":
    return jnp.max(history)
  return history[0]


def history_scale(history: jax.Array, spec: spec_lib.QuantSpec,
                  current_amax: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(s, scale_inv)`` scalars for delayed scaling, bootstrapping an empty history."""
  amax = history_amax(history, spec)
  amax = jnp.where(amax > 0, amax, current_amax)
  return scales.compute_scale(amax, spec)


def update_history(history: jax.Array, amax: jax.Array) -> jax.Array:
  """Pushes ``amax`` in as the most recent entry; the oldest entry drops out."""
  amax = jnp.asarray(amax, jnp.float32).reshape((1,))
  return jnp.concatenate([amax, history[:-1]])


def tensor_amax(x: jax.Array) -> jax.Array:
  """Largest finite |x| (float32 scalar) of a whole tensor."""
  return jnp.max(blocks.finite_abs(x), initial=0.0)


def as_float32(history: jax.Array) -> jax.Array:
  """A history as plain float32 (undoes :func:`max_combined`)."""
  return lax.convert_element_type(history, jnp.float32)


def max_combined(state):
  """Marks every history in ``state`` so repeated uses max-combine under jax.grad.

  Converts the float32 leaves to Flax's ``fp32_max_grad`` dtype, whose cotangents add
  by ``max``. Call it once, inside the differentiated function, on the state argument.
  """
  from flax.linen import fp8_ops  # pylint: disable=import-outside-toplevel

  return jax.tree.map(
      lambda h: lax.convert_element_type(h, fp8_ops.fp32_max_grad), state)
