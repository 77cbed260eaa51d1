"""Bad input to the public functions: a TypeError or ValueError that names the function and
the argument (and, for a string where a spec or config belongs, the call that makes one),
never an AttributeError from deep inside."""

import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import grouped

X = jnp.ones((4, 128), jnp.float32)
SPEC = fp8jax.preset("deepseek_v3")
DIMS = (((1,), (0,)), ((), ()))

CASES = {
    "dequantize_array": (lambda: fp8jax.dequantize(jnp.ones(2)), TypeError,
                         r"dequantize: qt must be a QTensor"),
    "dequantize_dtype": (lambda: fp8jax.dequantize(fp8jax.quantize(X, SPEC), "nosuch"),
                         TypeError, r"dequantize: dtype must be a floating-point dtype"),
    "quantize_list": (lambda: fp8jax.quantize([1.0], SPEC), TypeError,
                      r"quantize: x must be a jax.Array or numpy.ndarray, got list"),
    "quantize_preset_name": (lambda: fp8jax.quantize(X, "deepseek_v3"), TypeError,
                             r"quantize: spec must be a QuantSpec, got the string "
                             r"'deepseek_v3'; for a named preset pass "
                             r"fp8jax\.preset\('deepseek_v3'\)"),
    "quantize_none_spec": (lambda: fp8jax.quantize(X, None), TypeError,
                           r"quantize: spec must be a QuantSpec"),
    "quantize_dequantize_name": (lambda: fp8jax.quantize_dequantize(X, "mxfp8"), TypeError,
                                 r"quantize_dequantize: spec .*fp8jax\.preset\('mxfp8'\)"),
    "quantize_dequantize_list": (lambda: fp8jax.quantize_dequantize([1.0], SPEC), TypeError,
                                 r"quantize_dequantize: x must be"),
    "quantize_and_update_name": (
        lambda: fp8jax.quantize_and_update(X, "te_hybrid", jnp.zeros(1024)), TypeError,
        r"quantize_and_update: spec .*fp8jax\.preset\('te_hybrid'\)"),
    "fake_quant_list": (lambda: fp8jax.fake_quant([1.0], SPEC), TypeError,
                        r"fake_quant: x must be"),
    "saturating_cast_unknown": (lambda: fp8jax.saturating_cast(X, "nosuch"), ValueError,
                                r"saturating_cast: fmt: unknown FP8 format 'nosuch'"),
    "saturating_cast_type": (lambda: fp8jax.saturating_cast(X, 8), TypeError,
                             r"saturating_cast: fmt must be a FloatFormat or a format name"),
    "saturating_cast_list": (lambda: fp8jax.saturating_cast([1.0], fp8jax.get_format("e4m3")),
                             TypeError, r"saturating_cast: x must be"),
    "compute_scale_name": (lambda: fp8jax.compute_scale(jnp.float32(1), "mxfp8"), TypeError,
                           r"compute_scale: spec .*fp8jax\.preset\('mxfp8'\)"),
    "compute_scales_list": (lambda: fp8jax.compute_scales([1.0], fp8jax.preset("nvfp4")),
                            TypeError, r"compute_scales: amax must be"),
    "round_pow2_list": (lambda: fp8jax.round_pow2([3.0], "floor"), TypeError,
                        r"round_pow2: v must be"),
    "preset_not_a_string": (lambda: fp8jax.preset(123), TypeError,
                            r"preset: name must be a string"),
    "get_format_not_a_string": (lambda: fp8jax.get_format(None), TypeError,
                                r"format name must be a string"),
    "quant_spec_format_none": (lambda: fp8jax.QuantSpec(format=None), TypeError,
                               r"format name must be a string"),
    "block_int": (lambda: fp8jax.block(16), TypeError, r"block: sizes must be a pair"),
    "dot_general_recipe_name": (
        lambda: fp8jax.fp8_dot_general(X, X.T, DIMS, config="fp32_blockwise"), TypeError,
        r"fp8_dot_general: config must be a GemmConfig, got the string 'fp32_blockwise'; "
        r"for a named recipe pass fp8jax\.recipe\('fp32_blockwise'\)"),
    "dot_general_spec_as_config": (
        lambda: fp8jax.fp8_dot_general(X, X.T, DIMS, config=SPEC), TypeError,
        r"fp8_dot_general: config must be a GemmConfig"),
    "dot_general_list": (lambda: fp8jax.fp8_dot_general([[1.0]], X.T, DIMS), TypeError,
                         r"fp8_dot_general: lhs must be"),
    "dot_general_dims_shape": (lambda: fp8jax.fp8_dot_general(X, X.T, ((1,), (0,))),
                               ValueError, r"fp8_dot_general: dimension_numbers must be"),
    "dot_general_dims_range": (
        lambda: fp8jax.fp8_dot_general(X, X.T, (((5,), (0,)), ((), ()))), ValueError,
        r"fp8_dot_general: dimension_numbers .* outside lhs of rank 2"),
    "dot_general_fn_name": (lambda: fp8jax.dot_general_fn("mxfp8"), TypeError,
                            r"dot_general_fn: config .*recipe\('mxfp8'\)"),
    "einsum_recipe_name": (lambda: fp8jax.fp8_einsum("ik,kj->ij", X, X.T, config="mxfp8"),
                           TypeError, r"fp8_einsum: config .*recipe\('mxfp8'\)"),
    "ragged_recipe_name": (
        lambda: grouped.fp8_ragged_dot(X, jnp.ones((2, 128, 8)), jnp.array([2, 2]), "mxfp8"),
        TypeError, r"fp8_ragged_dot: config .*recipe\('mxfp8'\)"),
    "ragged_group_sizes_list": (
        lambda: grouped.fp8_ragged_dot(X, jnp.ones((2, 128, 8)), [2, 2]), TypeError,
        r"fp8_ragged_dot: group_sizes must be"),
    "ragged_weight_rank": (
        lambda: grouped.fp8_ragged_dot(X, jnp.ones((128, 8)), jnp.array([2, 2])), ValueError,
        r"fp8_ragged_dot: w must have rank 3"),
    "init_state_name": (lambda: fp8jax.quant.delayed.init_state("te_hybrid"), TypeError,
                        r"init_state: spec .*fp8jax\.preset\('te_hybrid'\)"),
    "scaled_matmul_arrays": (
        lambda: fp8jax.gemm.accumulate.scaled_matmul(X, X, fp8jax.gemm.accumulate.FP32), TypeError,
        r"scaled_matmul: a must be a QTensor"),
    "transposed_name": (
        lambda: fp8jax.gemm.transpose.transposed(X, fp8jax.quantize(X, SPEC), "deepseek_v3",
                                            "requant"),
        TypeError, r"transposed: spec .*fp8jax\.preset\('deepseek_v3'\)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_names_the_argument(case):
  call, error, message = CASES[case]
  with pytest.raises(error, match=message):
    call()


def test_names_that_are_accepted():
  """A format name works where a FloatFormat does; NumPy inputs and Python scalars too."""
  np.testing.assert_array_equal(
      fp8jax.saturating_cast(X * 500, "e4m3").astype(jnp.float32), jnp.full((4, 128), 448.0))
  assert fp8jax.QuantSpec(format=jnp.dtype("float8_e5m2")).format == "e5m2"
  s, inv = fp8jax.compute_scale(3.0, fp8jax.QuantSpec(scale_format="pow2"))
  assert (float(s), float(inv)) == (128.0, 2.0**-7)
  assert fp8jax.quantize(np.ones((2, 128), np.float32), SPEC).shape == (2, 128)
