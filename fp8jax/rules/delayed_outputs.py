"""Delayed scaling on module outputs: their amax histories as explicit, functional state.

An ``output`` rule whose spec uses delayed scaling (``e4m3/delayed(h=16)``, the
``te_hybrid`` preset) quantizes each floating-point array of the module's output with the
amax history of the previous steps there. The state is a plain pytree keyed by module
path, then by the array's index among the output's floating-point leaves (0 for an array
output; :func:`fp8jax.rules.ops.quantize_output`'s order)::

    {"layers/0/attn": {0: {"fwd": float32 [h]}}, "layers/1/mlp": {0: {"fwd": ..., "bwd": ...}}}

``fwd`` is the forward tensor's history, ``bwd`` its cotangent's (each present only where
that direction is delayed-scaled; entry 0 the most recent, all zeros: nothing recorded
yet, where :mod:`fp8jax.quant.delayed` takes the tensor's own amax). The model runs inside
:func:`delayed_scope`, opened *inside* the traced function with the state as its input, and
the updated state is the gradient with respect to it (the overwrite-with-gradient form of
:mod:`fp8jax.quant.delayed`)::

    state = delayed_init(qmodel, x)                   # only the modules that run
    def loss(params, state, x):
      with delayed_scope(state):
        return jnp.mean(nnx.merge(graphdef, params)(x) ** 2)
    grads, state = jax.grad(loss, argnums=(0, 1))(params, state, x)

Each history takes one use per forward pass (its update is exact without
max-combining), so a module called twice in one pass is refused. Limits of the gradient
channel: an output array the differentiated value does not depend on (e.g. router weights
returned only for statistics) gets a zero update, so its history restarts every step and
its scaling is current; a module inside a ``lax.scan`` / ``nnx.scan`` body is traced once
but runs once per iteration, so its update would be the sum over the iterations (not
detected: unroll such layers).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fp8jax.numerics.spec import QuantSpec
from fp8jax.quant import delayed
from fp8jax.rules import rule as rule_lib


@dataclasses.dataclass
class _Scope:
  state: dict | None  # None: discovering (fresh empty histories, shapes recorded)
  used: dict = dataclasses.field(default_factory=dict)  # path -> {leaf: {dir: shape}}


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "fp8jax_rules_delayed", default=None)


def active() -> bool:
  """Whether a :func:`delayed_scope` (or :func:`delayed_init`'s trace) is open."""
  return _SCOPE.get() is not None


def directions(spec: QuantSpec) -> dict[str, int]:
  """``{"fwd"/"bwd": history length}`` of the delayed directions of ``spec``."""
  st = delayed.init_state(spec)
  return {k: h.shape[0] for k, h in (("fwd", st.fwd), ("bwd", st.bwd)) if h is not None}


def layout(state) -> dict[str, list[int]]:
  """``{"path/.../fwd": shape}`` of a state of histories (what a checkpoint records)."""
  return {"/".join(str(getattr(k, "key", k)) for k in p): list(jnp.shape(x))
          for p, x in jax.tree_util.tree_flatten_with_path(state or {})[0]}


@contextlib.contextmanager
def delayed_scope(state, *, strict: bool = True):
  """Module outputs under delayed-scaling rules read their histories from ``state`` (see
  the module docstring) inside the block. Open it inside the traced function, with
  ``state`` among its inputs: histories captured as constants of a trace are refused.

  ``strict``: when the block ends without an exception, a ValueError names the histories
  of ``state`` that no module used (their gradient would be zeros, not an update)."""
  if not isinstance(state, dict):
    raise TypeError(f"delayed_scope: the state must be a dict {{module path: histories}} "
                    f"(fp8jax.rules.delayed_init), got {type(state).__name__}")
  scope = _Scope(state)
  token = _SCOPE.set(scope)
  try:
    yield state
  finally:
    _SCOPE.reset(token)
  unused = sorted(set(state) - set(scope.used))
  if strict and unused:
    raise ValueError(f"delayed_scope: the state holds amax histories that no module output "
                     f"used: {unused}; build it for these rules with fp8jax.rules.delayed_init")


@contextlib.contextmanager
def discovering():
  """A scope of fresh empty histories for an abstract trace (``describe``, the Linen plans,
  :func:`delayed_init`): yields ``{path: {leaf: {direction: length}}}`` of the
  delayed-scaled outputs run inside it."""
  scope = _Scope(None)
  token = _SCOPE.set(scope)
  try:
    yield scope.used
  finally:
    _SCOPE.reset(token)


def delayed_init(fn, *args, **kwargs) -> dict:
  """The empty amax histories (zeros) of every delayed-scaled module output that
  ``fn(*args, **kwargs)`` computes, found by an abstract trace (``jax.eval_shape`` over
  the array leaves of the inputs, arrays or ``jax.ShapeDtypeStruct``; other leaves are
  passed as given): only the modules that run, one entry per floating-point array of each
  output; ``{}`` without delayed scaling. ``fn``: e.g. a
  quantized NNX model, or a Linen ``model.apply`` run inside ``fp8jax.rules.intercept``.

  Raises:
    ValueError: a delayed-scaled module is called more than once in the pass."""
  leaves, treedef = jax.tree.flatten((args, kwargs))
  dyn = [i for i, x in enumerate(leaves) if isinstance(x, (jax.Array, np.ndarray,
                                                           jax.ShapeDtypeStruct))]

  def run(arrays):
    vals = list(leaves)
    for i, x in zip(dyn, arrays, strict=True):
      vals[i] = x
    a, k = jax.tree.unflatten(treedef, vals)
    fn(*a, **k)
    return 0

  with discovering() as found:
    jax.eval_shape(run, [leaves[i] for i in dyn])
  return histories(found)


def histories(found: dict) -> dict:
  """Zero histories of the layout ``{path: {leaf: {direction: length}}}``."""
  return {path: {i: {k: jnp.zeros((n,), jnp.float32) for k, n in dirs.items()}
                 for i, dirs in leaves.items()} for path, leaves in found.items()}


def _staged(x) -> bool:
  """Whether ``x`` is being staged into a jaxpr (``jit``, ``eval_shape``), not computed."""
  return isinstance(x, jax.core.Tracer) and getattr(x, "to_concrete_value", lambda: None)() is None


def _fits(entry, want: dict) -> bool:
  if not isinstance(entry, dict) or set(entry) != set(want):
    return False
  return all(isinstance(entry[i], dict) and set(entry[i]) == set(d) and all(
      tuple(jnp.shape(entry[i][k])) == (n,) for k, n in d.items()) for i, d in want.items())


def take(path: str, spec: QuantSpec, leaves, rule: str) -> list[delayed.DelayedState]:
  """The :class:`~fp8jax.quant.delayed.DelayedState` of each of ``leaves`` (the floating-
  point arrays of the output of the module at ``path``, quantized by ``spec``, the output
  rule ``rule``) from the open scope; ValueError, one line, when no scope is open, when
  the module already ran in it, or when its histories do not fit."""
  scope = _SCOPE.get()
  if scope is None:
    raise rule_lib.stateless_error(rule, path)
  if path in scope.used:
    raise ValueError(f"module {path!r} is called more than once in one forward pass, and "
                     f"{rule or 'its output rule'} puts delayed scaling on its output: its "
                     "amax history takes one update per pass (use current scaling there, "
                     "or one module per call)")
  want = {i: directions(spec) for i in range(len(leaves))}
  scope.used[path] = want
  if scope.state is None:
    return [delayed.init_state(spec) for _ in leaves]
  if path not in scope.state:
    raise ValueError(f"the delayed-scaling state has no amax histories for module {path!r} "
                     f"({rule or 'its output rule'}); build it for these rules with "
                     "fp8jax.rules.delayed_init (a model's delayed_init(policy))")
  entry = scope.state[path]
  if not _fits(entry, want):
    raise ValueError(f"the amax histories of module {path!r} are {layout(entry)}, but "
                     f"{rule or 'its output rule'} needs {layout(histories({0: want})[0])} "
                     "(leaf/direction: shape); build them with fp8jax.rules.delayed_init")
  if any(map(_staged, leaves)) and not all(
      isinstance(h, jax.core.Tracer) for h in jax.tree.leaves(entry)):
    raise ValueError(f"the amax histories of module {path!r} are constants of a traced "
                     "function: pass the state as an input of the jitted function and "
                     "open delayed_scope inside it")
  return [delayed.DelayedState(fwd=entry[i].get("fwd"), bwd=entry[i].get("bwd"))
          for i in range(len(leaves))]
