"""fp8jax: simulated FP8 numerics for JAX, to study FP8 in sparse-MoE LLM training.

The quantization core::

    import fp8jax
    spec = fp8jax.preset("deepseek_v3")          # E4M3, 1x128 tiles, current scaling
    qt = fp8jax.quantize(x, spec)                 # FP8 payload + per-tile scales
    x_hat = fp8jax.dequantize(qt)
    y = fp8jax.fake_quant(x, spec)                # custom_vjp round trip

and the simulated blockwise FP8 GEMM (``fp8jax.fp8_dot_general``, ``GemmConfig``).

Importing fp8jax has no side effects: it defines functions and types only.
"""

from fp8jax import accumulate, delayed, gemm, grouped_gemm, transpose
from fp8jax.accumulate import Accumulation
from fp8jax.delayed import DelayedState
from fp8jax.fake_quant import fake_quant
from fp8jax.formats import FORMATS, Fp8Format, get_format, saturating_cast
from fp8jax.gemm import GemmConfig, dot_general_fn, fp8_dot_general, fp8_einsum
from fp8jax.granularity import Granularity, block, per_axis, per_tensor, tile
from fp8jax.presets import PRESETS, preset
from fp8jax.qtensor import QTensor, dequantize, quantize, quantize_and_update, quantize_dequantize
from fp8jax.roles import RoleSpecs, deepseek_v3_roles
from fp8jax.scales import compute_scale, round_pow2
from fp8jax.spec import QuantSpec
from fp8jax.telemetry import QuantTelemetry

__version__ = "0.1.0"

__all__ = [
    "Accumulation", "GemmConfig", "accumulate", "dot_general_fn", "fp8_dot_general",
    "fp8_einsum", "gemm", "grouped_gemm", "transpose",
    "FORMATS", "PRESETS", "DelayedState", "Fp8Format", "Granularity", "QTensor",
    "QuantSpec", "QuantTelemetry", "RoleSpecs", "block", "compute_scale", "deepseek_v3_roles",
    "delayed", "dequantize", "fake_quant", "get_format", "per_axis", "per_tensor", "preset",
    "quantize", "quantize_and_update", "quantize_dequantize", "round_pow2",
    "saturating_cast", "tile",
]
