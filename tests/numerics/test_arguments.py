"""fp8jax.numerics.arguments: arguments of the right type pass through unchanged; a wrong
one is a TypeError naming the function, the argument and the value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.numerics import arguments


def test_arrays_pass_and_lists_are_told_to_be_wrapped():
  x = np.ones(3, np.float32)
  assert arguments.array(x, "x", "f") is x
  assert arguments.array(np.float32(2), "x", "f") == 2
  assert jax.jit(lambda t: arguments.array(t, "x", "f") * 2)(jnp.ones(2)).tolist() == [2, 2]
  with pytest.raises(TypeError, match=r"^quantize: x must be a jax.Array or numpy.ndarray, "
                     r"got list \[1, 2\]; wrap it with jnp.asarray"):
    arguments.array([1, 2], "x", "quantize")
  with pytest.raises(TypeError, match=r"got str 'abc'$"):
    arguments.array("abc", "x", "f")
  with pytest.raises(TypeError, match=r"got str 'y{56}\.\.\.$"):  # repr cut to 60 characters
    arguments.array("y" * 100, "x", "f")


def test_float_array_takes_python_numbers_but_not_bools():
  got = arguments.float_array(3, "amax", "f")
  assert got.dtype == jnp.float32 and float(got) == 3.0
  assert float(arguments.float_array(0.5, "amax", "f")) == 0.5
  with pytest.raises(TypeError, match="amax must be a jax.Array"):
    arguments.float_array(True, "amax", "f")


def test_specs_and_dtypes():
  spec = fp8jax.preset("deepseek_v3")
  assert arguments.quant_spec(spec, "spec", "f") is spec
  with pytest.raises(TypeError, match=r"f: spec must be a QuantSpec, got the string "
                     r"'mxfp8'; for a named preset pass fp8jax.preset\('mxfp8'\)"):
    arguments.quant_spec("mxfp8", "spec", "f")
  with pytest.raises(TypeError, match=r"spec must be a QuantSpec \(e.g. "
                     r"fp8jax.preset\('deepseek_v3'\)\), got int 3"):
    arguments.quant_spec(3, "spec", "f")
  assert arguments.dtype(jnp.bfloat16, "dtype", "f") == jnp.dtype(jnp.bfloat16)
  assert arguments.dtype("float32", "dtype", "f") == np.float32
  with pytest.raises(TypeError, match="f: dtype must be a floating-point dtype, got int32"):
    arguments.dtype(jnp.int32, "dtype", "f")
  with pytest.raises(TypeError, match="must be a floating-point dtype, got object"):
    arguments.dtype(object(), "dtype", "f")
