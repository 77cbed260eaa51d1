"""Checks of the public functions' arguments: a wrong argument gets a TypeError or
ValueError that names the function, the argument and what was passed, never an
AttributeError from deep inside.

The checks look at Python types only, so they cost nothing under ``jax.jit`` and accept
tracers (every tracer is a ``jax.Array``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fp8jax.numerics import spec as spec_lib

_ARRAYS = (jax.Array, np.ndarray, np.generic)


def _describe(value) -> str:
  text = repr(value)
  text = text if len(text) <= 60 else text[:57] + "..."
  return f"{type(value).__name__} {text}"


def array(value, arg: str, fn: str):
  """``value`` when it is a JAX or NumPy array (or NumPy scalar), else TypeError."""
  if isinstance(value, _ARRAYS):
    return value
  hint = "; wrap it with jnp.asarray(...)" if isinstance(value, (list, tuple)) else ""
  raise TypeError(f"{fn}: {arg} must be a jax.Array or numpy.ndarray, got "
                  f"{_describe(value)}{hint}")


def float_array(value, arg: str, fn: str):
  """An array argument that also accepts Python ints and floats (as float32 scalars)."""
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return jnp.float32(value)
  return array(value, arg, fn)


def named(value, cls: type, arg: str, fn: str, maker: str, kind: str, example: str):
  """``value`` when it is a ``cls``, else TypeError; a string is answered with the call
  ``maker(value)`` that builds the named ``kind`` (a preset, a recipe)."""
  if isinstance(value, cls):
    return value
  if isinstance(value, str):
    raise TypeError(f"{fn}: {arg} must be a {cls.__name__}, got the string {value!r}; for "
                    f"a named {kind} pass {maker}({value!r})")
  raise TypeError(f"{fn}: {arg} must be a {cls.__name__} (e.g. {maker}({example!r})), got "
                  f"{_describe(value)}")


def quant_spec(value, arg: str, fn: str) -> spec_lib.QuantSpec:
  """``value`` when it is a :class:`QuantSpec` (see :func:`named`)."""
  return named(value, spec_lib.QuantSpec, arg, fn, "fp8jax.preset", "preset", "deepseek_v3")


def dtype(value, arg: str, fn: str) -> np.dtype:
  """A floating-point dtype, else TypeError."""
  try:
    dt = jnp.dtype(value)
  except TypeError:
    raise TypeError(f"{fn}: {arg} must be a floating-point dtype, got "
                    f"{_describe(value)}") from None
  if not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"{fn}: {arg} must be a floating-point dtype, got {dt}")
  return dt
