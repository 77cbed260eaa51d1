r"""fp8jax: simulated FP8, MX and NVFP4 numerics for JAX, to study low precision in
sparse-MoE LLM training.

A recipe on any Flax model, by rules over its module paths::

    import fp8jax
    rules = fp8jax.Rules([fp8jax.Rule(r"layers/\d+/mlp/.*", fp8jax.recipe("mxfp8"))])
    # a recipe with BF16 layers (NVFP4 keeps the last ~16%), its tail as rules too:
    rules = fp8jax.rules.Recipe.named("nvfp4_recipe").rules(12, "layers/{i}/.*")
    model = fp8jax.quantize_model(model, rules)   # NNX; Linen: fp8jax.intercept(rules)
    print(fp8jax.describe(model, rules, x))       # each GEMM that ran, and its action

The quantization core::

    spec = fp8jax.preset("deepseek_v3")          # E4M3, 1x128 tiles, current scaling
    qt = fp8jax.quantize(x, spec)                 # FP8 payload + per-tile scales
    x_hat = fp8jax.dequantize(qt)
    y = fp8jax.fake_quant(x, spec)                # custom_vjp round trip

and the simulated blockwise GEMM (``fp8jax.fp8_dot_general``, ``GemmConfig``). The names
here are functions and classes; modules are reached through their package
(``fp8jax.gemm.recipes``, ``fp8jax.quant.delayed``, ``fp8jax.numerics.formats``).

The package is layered; each layer imports only the ones above it in this list:

* :mod:`fp8jax.numerics`: element formats, granularities, specs, scales, presets;
* :mod:`fp8jax.kernels`: GPU kernels (Pallas) that the ops choose on GPUs;
* :mod:`fp8jax.quant`: quantize / dequantize / fake-quant ops, delayed scaling, telemetry;
* :mod:`fp8jax.gemm`: the simulated FP8 GEMM (dense and grouped), accumulation, transposes;
* :mod:`fp8jax.rules`: precision rules over module paths for any Flax model (it imports
  the layers above it, never this module);
* this module: the public API (re-exported names only);
* :mod:`fp8jax.models`: DeepSeek-MoE with precision policies and named sites;
* :mod:`fp8jax.data`, :mod:`fp8jax.metrics` (side layers with no fp8jax imports above);
* :mod:`fp8jax.train`, then :mod:`fp8jax.study`, then the binaries in
  :mod:`fp8jax.experiments`.

Importing fp8jax has no side effects: it defines functions and types only.
"""

from fp8jax.gemm.accumulate import Accumulation
from fp8jax.gemm.dense import GemmConfig, dot_general_fn, fp8_dot_general, fp8_einsum
from fp8jax.gemm.recipes import recipe
from fp8jax.numerics.formats import FloatFormat, get_format, saturating_cast
from fp8jax.numerics.granularity import Granularity, block, per_axis, per_tensor, tile
from fp8jax.numerics.presets import preset
from fp8jax.numerics.roles import RoleSpecs, deepseek_v3_roles
from fp8jax.numerics.scales import compute_scale, compute_scales, round_pow2
from fp8jax.numerics.spec import QuantSpec
from fp8jax.quant.delayed import DelayedState
from fp8jax.quant.fake_quant import fake_quant
from fp8jax.quant.qtensor import (
    QTensor,
    dequantize,
    quantize,
    quantize_and_update,
    quantize_dequantize,
)
from fp8jax.quant.telemetry import QuantTelemetry
from fp8jax.rules import Rule, Rules, describe, intercept, quantize_gemms, quantize_model

__version__ = "0.1.0"

__all__ = [
    # Precision rules over any Flax model's module paths (fp8jax.rules).
    "Rule", "Rules", "describe", "intercept", "quantize_gemms", "quantize_model",
    # The simulated low-precision GEMM and its named recipes (fp8jax.gemm).
    "Accumulation", "GemmConfig", "dot_general_fn", "fp8_dot_general", "fp8_einsum", "recipe",
    # Formats, granularities, specs and scales (fp8jax.numerics).
    "FloatFormat", "Granularity", "QuantSpec", "RoleSpecs", "block", "compute_scale",
    "compute_scales", "deepseek_v3_roles", "get_format", "per_axis", "per_tensor", "preset",
    "round_pow2", "saturating_cast", "tile",
    # Quantize ops (fp8jax.quant).
    "DelayedState", "QTensor", "QuantTelemetry", "dequantize", "fake_quant", "quantize",
    "quantize_and_update", "quantize_dequantize",
]
