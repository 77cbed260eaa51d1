"""`fake_quant`: quantize-dequantize with an explicit, configurable backward pass.

A plain ``astype(fp8)`` round trip would also quantize the cotangent (JAX
differentiates the casts), so the gradient is defined by hand with ``jax.custom_vjp``:

* ``spec.backward is None``: straight-through, the cotangent passes unchanged;
* otherwise the cotangent is fake-quantized with ``spec.backward`` (for example
  E5M2 per-tensor as in Transformer Engine's HYBRID recipe, or E4M3 1x128 as in
  DeepSeek-V3).

Delayed scaling takes a :class:`fp8jax.quant.delayed.DelayedState`; its updated histories
come back as the gradient with respect to that state (see ``fp8jax.quant.delayed``).

Without telemetry, current-scaled round trips (forward and cotangent) use the fused
path of ``fp8jax.quant.fused_round_trip``: no FP8 payload is materialized and the result is equal
bit for bit to ``fp8jax.quantize_dequantize``; on Hopper GPUs, 1 x t tiles in E4M3/E5M2
run as one Pallas kernel with the same bits (``fp8jax.kernels.fake_quant_pallas``, not
under a multi-device context mesh: see ``fp8jax.kernels.placement``). Telemetry and
delayed scaling use the payload path of ``fp8jax.quant.qtensor``.
"""

from __future__ import annotations

import functools

import jax
from jax import lax

from fp8jax.kernels import fake_quant_pallas as fqp
from fp8jax.numerics import arguments
from fp8jax.numerics import spec as spec_lib
from fp8jax.quant import delayed, fused_round_trip, qtensor


def fake_quant(x: jax.Array, spec: spec_lib.QuantSpec,
               state: delayed.DelayedState | None = None, *, key: jax.Array | None = None,
               telemetry: bool = False):
  """Quantizes and dequantizes ``x``; the backward pass follows ``spec.backward``.

  Args:
    x: float array of any shape.
    spec: the forward spec; ``spec.backward`` quantizes the cotangent.
    state: a :class:`DelayedState` when ``spec`` or ``spec.backward`` uses delayed
      scaling (build it with ``fp8jax.quant.delayed.init_state(spec)``), otherwise None.
    key: PRNG key for stochastic rounding (the forward uses it, the cotangent
      ``fold_in(key, 1)``); None derives keys from the tensors' bits (see
      ``fp8jax.quant.rounding_bits``).
    telemetry: also return a :class:`QuantTelemetry` of the forward quantization.

  Returns:
    ``x_hat`` with the shape and dtype of ``x``, or ``(x_hat, telemetry)``. On concrete
    arrays it runs as one compiled program per shape and spec, as a jitted caller does.
  """
  spec = arguments.quant_spec(spec, "spec", "fake_quant")
  x = arguments.array(x, "x", "fake_quant")
  concrete = not qtensor.traced(x, state, key)  # one compiled program, not op by op
  if delayed.needs_state(spec):
    _check_state(state, spec)
    out = (_stateful_compiled if concrete else _fake_quant_stateful)(x, state, spec, telemetry)
  else:
    if state is not None:
      raise ValueError(
          f"spec {spec.describe()} uses no delayed scaling; pass state=None")
    if key is not None and not _stochastic(spec):
      key = None  # nothing to draw: keep the traced program key-free
    out = (_compiled if concrete else _fake_quant)(x, key, spec, telemetry)
  return out if telemetry else out[0]


def _check_state(state, spec):
  if not isinstance(state, delayed.DelayedState):
    raise TypeError(
        f"spec {spec.describe()} uses delayed scaling: pass a DelayedState built by "
        f"fp8jax.quant.delayed.init_state(spec), got {type(state).__name__}")
  if spec.scaling == "delayed":
    delayed.check_history(state.fwd, spec, "forward")
  elif state.fwd is not None:
    raise ValueError("state.fwd is set but the forward spec uses current scaling")
  bwd = spec.backward
  if bwd is not None and bwd.scaling == "delayed":
    delayed.check_history(state.bwd, bwd, "backward")
  elif state.bwd is not None:
    raise ValueError("state.bwd is set but the backward spec is not delayed-scaled")


def _stochastic(spec):
  return spec.rounding != "nearest" or (
      spec.backward is not None and spec.backward.rounding != "nearest")


def _fused(x, spec, key=None):
  """The one-pass round trip: the Pallas kernel on Hopper GPUs (bit-identical, see
  ``fp8jax.kernels.fake_quant_pallas``), else the fused XLA path."""
  if fqp.auto_applies(x.shape, x.dtype, spec):
    return fqp.fake_quant_pallas(x, spec, **fqp.auto_config(spec))
  return fused_round_trip.quantize_dequantize_fused(x, spec, key)


def _round_trip(x, spec, history, telemetry, key=None):
  if not telemetry and history is None and fused_round_trip.supports(spec):
    return _fused(x, spec, key), None
  out = qtensor.quantize_dequantize(x, spec, history, key=key, telemetry=telemetry)
  return out if telemetry else (out, None)


def _quantize_cotangent(g, spec, key=None):
  """Cotangent for a stateless site: identity or current-scaled fake-quant."""
  if spec.backward is None:
    return g
  key = None if key is None else jax.random.fold_in(key, 1)
  if fused_round_trip.supports(spec.backward):
    return _fused(g, spec.backward, key)
  return qtensor.quantize_dequantize(g, spec.backward, key=key)


# --- current scaling (no state) --------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _fake_quant(x, key, spec, telemetry):
  return _round_trip(x, spec, None, telemetry, key)


def _fake_quant_fwd(x, key, spec, telemetry):
  return _round_trip(x, spec, None, telemetry, key), key


def _fake_quant_bwd(spec, telemetry, key, cotangents):
  del telemetry
  return (_quantize_cotangent(cotangents[0], spec, key), None)


_fake_quant.defvjp(_fake_quant_fwd, _fake_quant_bwd)


# --- delayed scaling (state in, updated state as its gradient) --------------------


def _stateful_forward(x, state, spec, telemetry):
  fwd_history = None if state.fwd is None else delayed.as_float32(state.fwd)
  return _round_trip(x, spec, fwd_history, telemetry)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _fake_quant_stateful(x, state, spec, telemetry):
  return _stateful_forward(x, state, spec, telemetry)


def _fake_quant_stateful_fwd(x, state, spec, telemetry):
  out = _stateful_forward(x, state, spec, telemetry)
  return out, (state, delayed.tensor_amax(x))


def _fake_quant_stateful_bwd(spec, telemetry, residuals, cotangents):
  del telemetry
  state, x_amax = residuals
  g = cotangents[0]
  new_fwd = new_bwd = None
  if state.fwd is not None:
    new_fwd = delayed.update_history(delayed.as_float32(state.fwd), x_amax)
  bwd = spec.backward
  if state.bwd is not None:
    g_hist = delayed.as_float32(state.bwd)
    g_out = qtensor.quantize_dequantize(g, bwd, g_hist)
    new_bwd = delayed.update_history(g_hist, delayed.tensor_amax(g))
  else:
    g_out = _quantize_cotangent(g, spec)
  new_state = delayed.DelayedState(
      fwd=_like(new_fwd, state.fwd), bwd=_like(new_bwd, state.bwd))
  return g_out, new_state


def _like(new, old):
  """``new`` converted to the dtype of ``old`` (float32 or Flax's max-grad dtype)."""
  return None if new is None else lax.convert_element_type(new, old.dtype)


_fake_quant_stateful.defvjp(_fake_quant_stateful_fwd, _fake_quant_stateful_bwd)

_compiled = jax.jit(_fake_quant, static_argnums=(2, 3))
_stateful_compiled = jax.jit(_fake_quant_stateful, static_argnums=(2, 3))

__all__ = ["fake_quant"]
