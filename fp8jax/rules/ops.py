"""The callables the rules put in place of a module's matmul, and the output fake-quant.

They are frozen dataclasses, so equal configs give equal (hashable) callables: a model
quantized twice by equal rules has an equal static structure and ``jax.jit`` does not
trace it again. Inside :func:`recording` each call is recorded, and runs under a name
scope that marks the jaxpr equations it makes (what ``describe`` reports as having run).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from fp8jax.gemm import dense, grouped
from fp8jax.numerics.spec import QuantSpec
from fp8jax.quant.delayed import needs_state
from fp8jax.quant.fake_quant import fake_quant
from fp8jax.rules import delayed_outputs

MARK = "fp8jax_hook_"
"""Name-scope prefix of a recorded call: ``fp8jax_hook_<index into the record>``."""


@dataclasses.dataclass(frozen=True)
class HookCall:
  """One call of a rule's callable: ``kind`` an op of :data:`fp8jax.rules.OPS` or
  ``"output"``; ``action`` its GemmConfig or QuantSpec; ``shapes`` its operands'."""

  kind: str
  path: str
  action: Any
  shapes: tuple[tuple[int, ...], ...]


_RECORD: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "fp8jax_rules_record", default=None)


@contextlib.contextmanager
def recording():
  """Yields the list of :class:`HookCall` made inside the block; call ``i`` runs under the
  name scope ``fp8jax_hook_<i>``, so a jaxpr traced inside the block shows its equations."""
  calls: list[HookCall] = []
  token = _RECORD.set(calls)
  try:
    yield calls
  finally:
    _RECORD.reset(token)


def _recorded(kind: str, path: str, action, *arrays):
  calls = _RECORD.get()
  if calls is None:
    return contextlib.nullcontext()
  calls.append(HookCall(kind, path, action, tuple(tuple(jnp.shape(a)) for a in arrays)))
  return jax.named_scope(f"{MARK}{len(calls) - 1}")


def swap_back(out, dimension_numbers, lhs_ndim: int, rhs_ndim: int):
  """The result of ``dot_general(rhs, lhs, swapped dims)`` in the order of
  ``dot_general(lhs, rhs, dims)``: batch, lhs free, rhs free."""
  (lc, rc), (lb, _) = dimension_numbers
  nb, n_l, n_r = len(lb), lhs_ndim - len(lc) - len(lb), rhs_ndim - len(rc) - len(lb)
  perm = [*range(nb), *range(nb + n_r, nb + n_r + n_l), *range(nb, nb + n_r)]
  return jnp.transpose(out, perm)


def weight_left(dot, lhs, rhs, dimension_numbers, precision=None,
                preferred_element_type=None):
  """``dot(rhs, lhs, ...)`` with the operands swapped, so that the weight ``lhs`` takes
  the rhs (weight) role, returned in the layout of ``dot_general(lhs, rhs, ...)``."""
  (lc, rc), (lb, rb) = dimension_numbers
  out = dot(rhs, lhs, ((rc, lc), (rb, lb)), precision, preferred_element_type)
  return swap_back(out, dimension_numbers, lhs.ndim, rhs.ndim)


@contextlib.contextmanager
def _at(op: str, path: str):
  """Re-raises a ValueError of the simulated GEMM (a spec that does not fit its operand)
  as one line naming the op and the module path."""
  try:
    yield
  except ValueError as e:
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ValueError(f"{op} rule at {path!r}: {first}") from e


def _dot(config: dense.GemmConfig, lhs, rhs, dimension_numbers, precision=None,
         preferred_element_type=None, **kwargs):
  """:func:`fp8jax.fp8_dot_general`, checking at once that the cotangent spec fits dY:
  dY [B, M, N] meets it only in the backward pass, where no module path is known."""
  out = dense.fp8_dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                              config=config, **kwargs)
  spec = config.roles.grad
  if spec is not None and (config.dgrad, config.wgrad) != ("bf16", "bf16"):
    (lc, _), (lb, _) = dimension_numbers
    nb, nl = len(lb), lhs.ndim - len(lc) - len(lb)
    dims = out.shape
    spec.granularity.block_shape((math.prod(dims[:nb]), math.prod(dims[nb:nb + nl]),
                                  math.prod(dims[nb + nl:])))
  return out


@dataclasses.dataclass(frozen=True)
class QuantDotGeneral:
  """A ``dot_general`` (Flax ``dot_general=`` hook) through :func:`fp8jax.fp8_dot_general`.
  ``path``: the module's path, for error messages."""

  config: dense.GemmConfig
  path: str = ""

  def __call__(self, lhs, rhs, dimension_numbers, precision=None,
               preferred_element_type=None, **kwargs):
    with _at("dot_general", self.path), _recorded("dot_general", self.path, self.config,
                                                   lhs, rhs):
      return _dot(self.config, lhs, rhs, dimension_numbers, precision, preferred_element_type,
                  **kwargs)


@dataclasses.dataclass(frozen=True)
class QuantEinsum:
  """An ``einsum`` (NNX ``einsum_op=`` hook): two-operand ``jnp.einsum`` whose contraction
  runs through :func:`fp8jax.fp8_dot_general` (the first operand is the input role)."""

  config: dense.GemmConfig
  path: str = ""

  def __call__(self, subscripts, lhs, rhs, *, precision=None, preferred_element_type=None,
               out_sharding=None):
    del out_sharding  # the simulated GEMM is not sharding-aware
    with _at("einsum", self.path), _recorded("einsum", self.path, self.config, lhs, rhs):
      return jnp.einsum(subscripts, lhs, rhs, precision=precision,
                        preferred_element_type=preferred_element_type,
                        _dot_general=functools.partial(_dot, self.config))


@dataclasses.dataclass(frozen=True)
class QuantRaggedDot:
  """A ``ragged_dot(x [N, K], w [E, K, F], group_sizes [E])`` through
  :func:`fp8jax.gemm.grouped.fp8_ragged_dot`."""

  config: dense.GemmConfig
  path: str = ""

  def __call__(self, lhs, rhs, group_sizes, **kwargs):
    del kwargs  # precision / preferred_element_type: the simulated GEMM sets its own
    with _at("ragged_dot", self.path), _recorded("ragged_dot", self.path, self.config, lhs,
                                                  rhs):
      return grouped.fp8_ragged_dot(lhs, rhs, group_sizes, config=self.config)


OP_CALLABLES = {"dot_general": QuantDotGeneral, "einsum": QuantEinsum,
                "ragged_dot": QuantRaggedDot}


def quantize_output(out, spec: QuantSpec, path: str, rule: str = ""):
  """``fake_quant(out, spec)`` on every floating-point array of the module's output
  ``out``: an array or a pytree of them, where a plain tuple or list is ``(output,
  *auxiliary)`` (an MoE's routing and balance loss, attention weights): only its first
  element is the output, the rest pass unchanged, as do non-float leaves. A
  delayed-scaled ``spec`` reads each array's amax history from the open
  :func:`~fp8jax.rules.delayed_outputs.delayed_scope` (``rule``: the output rule's label,
  for messages)."""
  if type(out) in (tuple, list) and out:
    return type(out)([quantize_output(out[0], spec, path, rule), *out[1:]])
  leaves, treedef = jax.tree.flatten(out)
  floats = [i for i, x in enumerate(leaves)
            if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)]
  states = [None] * len(floats)
  if needs_state(spec):
    states = delayed_outputs.take(path, spec, [leaves[i] for i in floats], rule)
  try:
    with _recorded("output", path, spec, *(x for x in leaves if isinstance(x, jax.Array))):
      for i, state in zip(floats, states, strict=True):
        leaves[i] = fake_quant(leaves[i], spec, state)
  except ValueError as e:
    raise ValueError(f"output rule at {path!r}: {e}") from None
  return jax.tree.unflatten(treedef, leaves)
