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
``mxfp8``                  MXFP8-like: E4M3 1x32 tiles, power-of-two scales
                           (``rceil``) stored as E8M0; cotangent the same
=========================  ======================================================
"""

from __future__ import annotations

from fp8jax.numerics import granularity as gran
from fp8jax.numerics.spec import QuantSpec

_TILE = QuantSpec(format="e4m3", granularity=gran.tile(128, axis=-1))
_MX = QuantSpec(format="e4m3", granularity=gran.tile(32, axis=-1),
                scale_format="pow2", pow2_rounding="rceil", store_e8m0=True)
_TE_GRAD = QuantSpec(format="e5m2", granularity=gran.per_tensor(), scaling="delayed")

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
}


def preset(name: str) -> QuantSpec:
  """The preset spec called ``name``; raises ValueError listing the known names."""
  if name not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
  return PRESETS[name]
