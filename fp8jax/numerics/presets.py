"""Named `QuantSpec` presets for the recipes people compare.

=========================  ======================================================
name                       recipe
=========================  ======================================================
``deepseek_v3``            activations: E4M3, 1x128 tiles, current scaling, FP32
                           scales; cotangent E4M3 1x128 (DeepSeek-V3, arXiv
                           2412.19437 section 3.3)
``deepseek_v3_weight``     weights: E4M3, 128x128 blocks, current scaling, FP32
                           scales; straight-through backward
``deepseek_v3_ue8m0``      ``deepseek_v3`` with power-of-two scales rounded like
                           DeepGEMM's UE8M0 path (``rceil``) and stored as E8M0
``te_hybrid``              Transformer Engine HYBRID: E4M3 forward, E5M2 cotangent,
                           both per-tensor delayed scaling, history 1024, max
``current_tensor``         E4M3 per-tensor current scaling, straight-through
``current_tensor_e5m2``    E5M2 per-tensor current scaling, straight-through
``mxfp8``                  MXFP8: E4M3 1x32 tiles along the contraction axis,
                           E8M0 scales rounded up (``rceil``: the MXFP8 pretraining
                           recipe, arXiv 2506.08027, and Transformer Engine's
                           ``float_to_e8m0(amax / max)``); E4M3 for the cotangent
                           too, as that recipe does
``mxfp8_ocp``              ``mxfp8`` with the OCP MX v1.0 scale rule (``ocp``,
                           section 6.3: floor(log2 amax) - emax; may saturate)
``mxfp8_e5m2``             MXFP8 with E5M2 elements (``rceil``), both directions
``mxfp6_e2m3``             MXFP6 E2M3, 1x32, E8M0 ``ocp`` scales, both directions
``mxfp6_e3m2``             MXFP6 E3M2, 1x32, E8M0 ``ocp`` scales, both directions
``mxfp4``                  MXFP4: E2M1, 1x32, E8M0 ``ocp`` scales (the OCP rule, as
                           the spec and its reference library define MXFP4)
``mxfp4_rceil``            ``mxfp4`` with round-up scales (no saturation)
``nvfp4``                  NVFP4: E2M1, 1x16 tiles, E4M3 block scales over an FP32
                           per-tensor scale (arXiv 2509.25149), round to nearest,
                           cotangent the same
``nvfp4_weight``           NVFP4 with 16x16 blocks (the recipe's weights: Fprop and
                           Dgrad see the same quantized weight); straight-through
``nvfp4_sr``               ``nvfp4`` with stochastic rounding from 8 random bits
                           per element, as Blackwell's ``cvt.rs`` and Transformer
                           Engine round (the recipe's gradients; ``sr_bits=24`` for
                           the nearly unbiased rounding)
``nvfp4_row_scaled``       ``nvfp4`` with the FP32 level per row (Transformer
                           Engine's ``row_scaled_nvfp4``, its activations with
                           ``row_scaled_activation``); the cotangent as ``nvfp4``
``nvfp4_ue5m3``            ``nvfp4`` with UE5M3 block scales, the tensor level
                           mapping the amax to 6 x 114688 (Transformer Engine
                           PR #3325); the cotangent the same
=========================  ======================================================

``fp8jax.gemm.recipes`` combines them per GEMM operand (e.g. the full NVFP4 recipe with
16x16 weights, stochastic rounding of gradients and the Hadamard transform on Wgrad).
"""

from __future__ import annotations

from fp8jax.numerics import granularity as gran
from fp8jax.numerics.spec import QuantSpec

_TILE = QuantSpec(format="e4m3", granularity=gran.tile(128, axis=-1))
# MX and NVFP4 take no eps (0): the formats' own range decides, not a floor on the amax
# (eps 1e-12 flushed every block below it to zero; E8M0 reaches 2**-127, and the NVFP4
# reference quantizer of Transformer Engine takes none). The exponent clamp [1, 253] of
# power-of-two scales and the clip of the NVFP4 tensor scale to [2**-126, 2**126] are the
# only floors left (docs/formats.md, "Conformance").
_MX = QuantSpec(format="e4m3", granularity=gran.tile(32, axis=-1),
                scale_format="pow2", pow2_rounding="rceil", store_e8m0=True, eps=0.0)
_TE_GRAD = QuantSpec(format="e5m2", granularity=gran.per_tensor(), scaling="delayed")
_MX_OCP = _MX.replace(pow2_rounding="ocp")
_MXFP6_E2M3 = _MX_OCP.replace(format="e2m3")
_MXFP6_E3M2 = _MX_OCP.replace(format="e3m2")
_MXFP4 = _MX_OCP.replace(format="e2m1")
_NVFP4 = QuantSpec(format="e2m1", granularity=gran.tile(16, axis=-1), scale_format="e4m3",
                   eps=0.0)

PRESETS: dict[str, QuantSpec] = {
    "deepseek_v3": _TILE.replace(backward=_TILE),
    "deepseek_v3_weight": QuantSpec(format="e4m3", granularity=gran.block((128, 128))),
    "deepseek_v3_ue8m0": _TILE.replace(
        scale_format="pow2", pow2_rounding="rceil", store_e8m0=True,
        backward=_TILE.replace(scale_format="pow2", pow2_rounding="rceil",
                               store_e8m0=True)),
    "te_hybrid": QuantSpec(format="e4m3", granularity=gran.per_tensor(),
                           scaling="delayed", backward=_TE_GRAD),
    "current_tensor": QuantSpec(format="e4m3", granularity=gran.per_tensor()),
    "current_tensor_e5m2": QuantSpec(format="e5m2", granularity=gran.per_tensor()),
    "mxfp8": _MX.replace(backward=_MX),
    "mxfp8_ocp": _MX_OCP.replace(backward=_MX_OCP),
    "mxfp8_e5m2": _MX.replace(format="e5m2", backward=_MX.replace(format="e5m2")),
    "mxfp6_e2m3": _MXFP6_E2M3.replace(backward=_MXFP6_E2M3),
    "mxfp6_e3m2": _MXFP6_E3M2.replace(backward=_MXFP6_E3M2),
    "mxfp4": _MXFP4.replace(backward=_MXFP4),
    "mxfp4_rceil": _MXFP4.replace(pow2_rounding="rceil",
                                  backward=_MXFP4.replace(pow2_rounding="rceil")),
    "nvfp4": _NVFP4.replace(backward=_NVFP4),
    "nvfp4_weight": _NVFP4.replace(granularity=gran.block((16, 16))),
    "nvfp4_sr": _NVFP4.replace(rounding="stochastic", sr_bits=8,
                               backward=_NVFP4.replace(rounding="stochastic", sr_bits=8)),
    "nvfp4_row_scaled": _NVFP4.replace(row_scaled=True, backward=_NVFP4),
    "nvfp4_ue5m3": _NVFP4.replace(scale_format="ue5m3",
                                  backward=_NVFP4.replace(scale_format="ue5m3")),
}


def preset(name: str) -> QuantSpec:
  """The preset spec called ``name``; raises ValueError listing the known names."""
  if not isinstance(name, str):
    raise TypeError(f"preset: name must be a string such as 'deepseek_v3', got "
                    f"{type(name).__name__} {name!r}")
  if name not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
  return PRESETS[name]
