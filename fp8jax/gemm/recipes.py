"""Named GEMM recipes: one :class:`fp8jax.GemmConfig` per training-precision recipe.

Operands are in contraction-last layout, so ``tile(n)`` is a 1 x n block along each GEMM's
contraction axis and ``block((16, 16))`` a 16 x 16 block of the weight.

==================  =======================================================================
name                recipe
==================  =======================================================================
``fp32_blockwise``  DeepSeek-V3 (arXiv 2412.19437, section 3.3): E4M3, 1x128 tiles for X
                    and dY, 128x128 blocks for W, FP32 scales, FP32 accumulation
``hopper_blockwise`` the same with the Hopper tensor-core accumulator model (promotion
                    every 128; see ``fp8jax.gemm.accumulate``)
``fp32_blockwise_mma`` ``fp32_blockwise`` with every kernel's products (dense and experts,
                    Fprop, Dgrad, Wgrad) on the FP8 tensor cores (``GemmConfig.fp8_mma``:
                    FP32 promotion after each MMA instruction, near but not bit for bit
                    the exact FP32 sums)
``fp8_tensor``      per-tensor current scaling, E4M3 for X and W, E5M2 for dY (Transformer
                    Engine's Float8CurrentScaling with the HYBRID format)
``mxfp8``           MXFP8 for every operand: E4M3, 1x32, E8M0 scales rounded up (the MXFP8
                    pretraining recipe, arXiv 2506.08027; Transformer Engine)
``mxfp4``           MXFP4 for every operand: E2M1, 1x32, E8M0 scales by the OCP rule
``nvfp4``           NVFP4 for every operand: E2M1, 1x16, E4M3 + FP32 scales, round to
                    nearest (the format alone, without the recipe's measures)
``nvfp4_recipe``    the NVFP4 training recipe (arXiv 2509.25149; Transformer Engine's NVFP4
                    recipe): 16x16 blocks for W (Fprop and Dgrad see the same quantized
                    weight), stochastic rounding of dY from 8 random bits per element (as
                    Blackwell's ``cvt.rs`` and TE), the 16-point random Hadamard transform
                    on the Wgrad operands with TE's fixed signs in BF16
                    (``fp8jax.gemm.hadamard``); a model policy also keeps the last layers
                    in BF16 (:data:`BF16_TAIL`)
==================  =======================================================================

Variants for the validation matrix (docs/validation.md): ``mxfp8_ocp`` (MXFP8 with the OCP
MX v1.0 scale rule, floor of log2(amax) minus the element's emax, instead of rounding the
scale up; arXiv 2506.08027 compares the two) and the NVFP4 recipe's ablations, each without
one of its elements (arXiv 2509.25149, section 4): ``nvfp4_recipe_no_rht`` (no Hadamard
transform), ``nvfp4_recipe_no_2d`` (1x16 weight blocks, so Fprop and Dgrad quantize the
weight along different axes), ``nvfp4_recipe_no_sr`` (dY rounded to nearest) and
``nvfp4_recipe_no_tail`` (every layer in NVFP4).

``mxfp8_oas`` and ``mxfp4_oas`` take the OAS scale rule (arXiv 2603.08713, as google/qwix
computes it: ``pow2_rounding="oas"``, one binade up where the block maximum would round
past the format's top). ``mxfp8_2d`` is MXFP8 with 32 x 32 weight blocks, so that Fprop and
Dgrad read the same quantized weight (Transformer Engine's ``MXFP8BlockScaling(
enable_2d_quantization=True)``; scales rounded up, as ``mxfp8``).

``nvfp4_4over6`` is the recipe with Four Over Six (arXiv 2512.02010) on the activations
and the weights, each block scaled to map its maximum to 4 or 6 by the smaller mean
absolute error (``QuantSpec.four_over_six``; the per-tensor scale over an E4M3 maximum of
256), as Transformer Engine's ``nvfp4_4over6="all"`` runs it: without the Hadamard
transform, which TE does not combine with 4/6; dY keeps 8-bit stochastic rounding and the
last layers stay in BF16.

``nvfp4_row_scaled`` and ``nvfp4_ue5m3`` are the NVFP4 recipe with one change each, as
Transformer Engine defines it: ``nvfp4_row_scaled`` scales the activations X per row (each
token's FP32 second level from its own amax, ``QuantSpec.row_scaled``; TE's
``NVFP4BlockScaling(row_scaled_activation=True)``, PR #2931 and #3206: forward
activations only, their Wgrad copy X^T per row of X^T), ``nvfp4_ue5m3`` stores every
operand's block scales in UE5M3, the tensor level mapping the amax to 6 x 114688
(``scale_format="ue5m3"``; TE PR #3325, the prototype in TE v2.21).

``nvfp4_quartet2`` is Quartet II (arXiv 2601.22813; IST-DASLab/Quartet-II commit 8776a90,
``schemes/quartet_2.py``): the forward GEMM on X and W in NVFP4 1x16 along K, each block
scaled by Four Over Six with the squared error (``four_over_six="mse"``, E4M3 maximum 256,
ties keep 6, as its ``rtn_1x16s_fp4_kernel``); both backward GEMMs on MS-EDEN operands
(``rounding="ms_eden"``, ``fp8jax.numerics.ms_eden``) behind a 128-point random Hadamard
rotation along their contraction axis with signs drawn afresh for each step, W^T and X^T
re-quantized from the forward's quantized W and X (``backward_from_forward``); every layer
quantized (no BF16 tail). ``nvfp4_quartet2_rtn`` has the forward without Four Over Six
(the default of the paper's sweep scripts), ``nvfp4_quartet2_sr`` stochastic rounding of
the elements (24 bits, no scale correction) in place of MS-EDEN: the paper's comparison.

``ufp4`` is UFP4 (arXiv 2606.20381): the uniform 4-bit grid E1M2 in 1x16 blocks with E4M3
scales over an FP32 tensor level (NVFP4's scaling, element grid swapped), the 16-point
random Hadamard transform (TE's signs, BF16) on the operands of all three GEMMs, stochastic
rounding (24 bits: no hardware rounds E1M2) on dY only, 1x16 weights (rotated along K for
Fprop and along N for Dgrad, one 16x16 quantization cannot serve both) and the last ~16%
of layers in BF16 as the NVFP4 recipe. ``ufp4_int4`` takes INT4 (±7), the same grid
times 4; ``ufp4_e2m1`` the same recipe on E2M1, the paper's contrast.

``mxfp8_fwd_nvfp4_bwd`` is Transformer Engine's ``CustomRecipe(qfactory=
mxfp8_fwd_nvfp4_bwd_factory)`` (``custom_recipes/quantizer_factory_zoo.py``, PR #2817):
Fprop on MXFP8 X and W; Dgrad on NVFP4 dY (8-bit stochastic rounding) and a plain NVFP4
1x16 W^T quantized from Fprop's MXFP8 W, dequantized (``from_forward=("weight",)``,
TE's ``columnwise_source="rowwise_dequantized"``); Wgrad on NVFP4 X^T (from the original
X) and dY^T behind the 16-point RHT (TE's signs, BF16), as the NVFP4 recipe's Wgrad. Each
backward copy has its own spec (``RoleSpecs.dgrad_weight``, ``wgrad_input``); every
layer quantized.

The idealised forms of the recipe's two random elements stay available as fields:
``recipe("nvfp4_recipe").replace(rht_signs="random", rht_dtype="float32")`` (signs drawn
from ``hadamard_seed``, the transform in float32) and a grad spec with ``sr_bits=24``;
``nvfp4_recipe_ideal`` has both (the recipe as this library simulated it before it
followed Transformer Engine's signs and the hardware's 8-bit stochastic rounding).
"""

from __future__ import annotations

import dataclasses

from fp8jax.gemm import accumulate
from fp8jax.gemm.dense import GemmConfig
from fp8jax.numerics import granularity as gran
from fp8jax.numerics import presets
from fp8jax.numerics.roles import RoleSpecs, deepseek_v3_roles
from fp8jax.numerics.spec import QuantSpec


def _same(spec: QuantSpec) -> RoleSpecs:
  """One spec (without its cotangent spec) for the three roles."""
  spec = spec.replace(backward=None)
  return RoleSpecs(input=spec, weight=spec, grad=spec)


_TENSOR = QuantSpec(format="e4m3", granularity=gran.per_tensor())
_NVFP4 = presets.preset("nvfp4").replace(backward=None)

RECIPES: dict[str, GemmConfig] = {
    "fp32_blockwise": GemmConfig(roles=deepseek_v3_roles()),
    "hopper_blockwise": GemmConfig(roles=deepseek_v3_roles(),
                                   accumulation=accumulate.HOPPER),
    "fp32_blockwise_mma": GemmConfig(roles=deepseek_v3_roles(), fp8_mma=True),
    "fp8_tensor": GemmConfig(roles=RoleSpecs(input=_TENSOR, weight=_TENSOR,
                                             grad=_TENSOR.replace(format="e5m2"))),
    "mxfp8": GemmConfig(roles=_same(presets.preset("mxfp8"))),
    "mxfp4": GemmConfig(roles=_same(presets.preset("mxfp4"))),
    "nvfp4": GemmConfig(roles=_same(_NVFP4)),
    "nvfp4_recipe": GemmConfig(
        roles=RoleSpecs(input=_NVFP4,
                        weight=presets.preset("nvfp4_weight"),
                        grad=_NVFP4.replace(rounding="stochastic", sr_bits=8)),
        wgrad_hadamard=16, rht_signs="te", rht_dtype="bfloat16"),
}
RECIPES["mxfp8_ocp"] = GemmConfig(roles=_same(presets.preset("mxfp8_ocp")))
RECIPES["nvfp4_recipe_no_rht"] = RECIPES["nvfp4_recipe"].replace(wgrad_hadamard=0)
RECIPES["nvfp4_recipe_no_2d"] = RECIPES["nvfp4_recipe"].replace(
    roles=dataclasses.replace(RECIPES["nvfp4_recipe"].roles, weight=_NVFP4))
RECIPES["nvfp4_recipe_no_sr"] = RECIPES["nvfp4_recipe"].replace(
    roles=dataclasses.replace(RECIPES["nvfp4_recipe"].roles, grad=_NVFP4))
RECIPES["nvfp4_recipe_no_tail"] = RECIPES["nvfp4_recipe"]
RECIPES["nvfp4_recipe_ideal"] = RECIPES["nvfp4_recipe"].replace(
    rht_signs="random", rht_dtype="float32",
    roles=dataclasses.replace(RECIPES["nvfp4_recipe"].roles,
                              grad=RECIPES["nvfp4_recipe"].roles.grad.replace(sr_bits=24)))

RECIPES["mxfp8_oas"] = GemmConfig(roles=_same(presets.preset("mxfp8").replace(
    pow2_rounding="oas")))
RECIPES["mxfp4_oas"] = GemmConfig(roles=_same(presets.preset("mxfp4").replace(
    pow2_rounding="oas")))
RECIPES["mxfp8_2d"] = RECIPES["mxfp8"].replace(roles=dataclasses.replace(
    RECIPES["mxfp8"].roles, weight=RECIPES["mxfp8"].roles.weight.replace(
        granularity=gran.block((32, 32)))))
RECIPES["nvfp4_4over6"] = RECIPES["nvfp4_recipe"].replace(
    wgrad_hadamard=0, roles=dataclasses.replace(
        RECIPES["nvfp4_recipe"].roles, input=_NVFP4.replace(four_over_six="mae"),
        weight=presets.preset("nvfp4_weight").replace(four_over_six="mae")))

_MS_EDEN = _NVFP4.replace(rounding="ms_eden")
_FOUR_SIX_MSE = _NVFP4.replace(four_over_six="mse")
RECIPES["nvfp4_quartet2"] = GemmConfig(
    roles=RoleSpecs(input=_FOUR_SIX_MSE, weight=_FOUR_SIX_MSE, grad=_MS_EDEN),
    wgrad_hadamard=128, rht_gemms="backward", rht_signs="step", rht_dtype="float32",
    backward_from_forward=True)
RECIPES["nvfp4_quartet2_rtn"] = RECIPES["nvfp4_quartet2"].replace(
    roles=RoleSpecs(input=_NVFP4, weight=_NVFP4, grad=_MS_EDEN))
RECIPES["nvfp4_quartet2_sr"] = RECIPES["nvfp4_quartet2"].replace(
    roles=RoleSpecs(input=_FOUR_SIX_MSE, weight=_FOUR_SIX_MSE,
                    grad=_NVFP4.replace(rounding="stochastic")))


def _ufp4(fmt: str) -> GemmConfig:
  spec = _NVFP4.replace(format=fmt)
  return GemmConfig(roles=RoleSpecs(input=spec, weight=spec,
                                    grad=spec.replace(rounding="stochastic")),
                    wgrad_hadamard=16, rht_gemms="all", rht_signs="te", rht_dtype="bfloat16")


RECIPES["ufp4"] = _ufp4("e1m2")
RECIPES["ufp4_int4"] = _ufp4("int4")
RECIPES["ufp4_e2m1"] = _ufp4("e2m1")

_MXFP8 = presets.preset("mxfp8").replace(backward=None)
RECIPES["mxfp8_fwd_nvfp4_bwd"] = GemmConfig(
    roles=RoleSpecs(input=_MXFP8, weight=_MXFP8, grad=RECIPES["nvfp4_recipe"].roles.grad,
                    dgrad_weight=_NVFP4, wgrad_input=_NVFP4),
    from_forward=("weight",), wgrad_hadamard=16, rht_signs="te", rht_dtype="bfloat16")

RECIPES["nvfp4_row_scaled"] = RECIPES["nvfp4_recipe"].replace(roles=dataclasses.replace(
    RECIPES["nvfp4_recipe"].roles, input=_NVFP4.replace(row_scaled=True)))
RECIPES["nvfp4_ue5m3"] = RECIPES["nvfp4_recipe"].replace(roles=dataclasses.replace(
    RECIPES["nvfp4_recipe"].roles,
    **{role: getattr(RECIPES["nvfp4_recipe"].roles, role).replace(scale_format="ue5m3")
       for role in ("input", "weight", "grad")}))

BF16_TAIL = {"nvfp4_recipe": 0.16, "nvfp4_recipe_no_rht": 0.16, "nvfp4_recipe_no_2d": 0.16,
             "nvfp4_recipe_no_sr": 0.16, "nvfp4_recipe_ideal": 0.16, "nvfp4_4over6": 0.16,
             "nvfp4_row_scaled": 0.16, "nvfp4_ue5m3": 0.16,
             "ufp4": 0.16, "ufp4_int4": 0.16, "ufp4_e2m1": 0.16}
"""Share of a model's final layers whose linear layers a recipe keeps in BF16 (the NVFP4
recipe keeps about 16% of the linear layers, mostly the last blocks, in BF16)."""


def bf16_tail_layers(share: float, num_layers: int) -> int:
  """How many final layers of ``num_layers`` a BF16 ``share`` keeps in BF16:
  ``max(1, round(share * num_layers))`` for a share > 0, else 0."""
  return max(1, round(share * num_layers)) if share else 0


def last_layers(count: int, num_layers: int) -> tuple[int, ...]:
  """The indices of the last ``count`` of ``num_layers`` layers (all of them if fewer)."""
  return tuple(range(max(num_layers - count, 0), num_layers))


def recipe(name: str) -> GemmConfig:
  """The GEMM config of the recipe called ``name``; raises ValueError listing the known
  names. Its BF16 layers (:data:`BF16_TAIL`) are not in it: rules that keep them are
  ``fp8jax.rules.Recipe.named(name).rules(num_layers, layer_path)``."""
  if name not in RECIPES:
    raise ValueError(f"unknown GEMM recipe {name!r}; known recipes: {sorted(RECIPES)}")
  return RECIPES[name]


__all__ = ["BF16_TAIL", "RECIPES", "bf16_tail_layers", "last_layers", "recipe"]
