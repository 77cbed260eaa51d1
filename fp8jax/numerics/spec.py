"""`QuantSpec`: the one frozen, hashable description of how a tensor is quantized.

A spec is static: it is safe as a ``jax.jit`` static argument and as a dict key, and
every invalid setting is rejected when the spec is built, not inside a trace.

Scale convention (as in Transformer Engine)::

    s         = fp8_max / (max(amax, eps) * 2**margin)    # quantization multiplier
    payload   = saturating_cast(x * s)                     # fp8
    scale_inv = 1 / s                                      # what a GEMM kernel consumes
    x_hat     = payload * scale_inv                        # dequantized

``amax`` is the largest |x| in the block; a block holding NaN or ±inf gets a NaN
``scale_inv`` and dequantizes to NaN as a whole (``fp8jax.numerics.scales``).

Two-level scales (``scale_format="e4m3"`` or ``"ue5m3"``, NVFP4) add a per-tensor FP32
level (per row with ``row_scaled``) below the per-block E4M3 (UE5M3) scales; see
``fp8jax.numerics.scales``. The format semantics and their
sources are collected in ``docs/formats.md``.
"""

from __future__ import annotations

import dataclasses
import math

from fp8jax.numerics import formats
from fp8jax.numerics import granularity as gran

SCALINGS = ("current", "delayed")
HISTORY_REDUCTIONS = ("max", "most_recent")
SCALE_FORMATS = ("fp32", "pow2", "e4m3", "ue5m3")
TWO_LEVEL = ("e4m3", "ue5m3")
"""The two-level scale formats: block scales (E4M3 or UE5M3) over an FP32 tensor level."""
POW2_ROUNDINGS = ("floor", "ceil", "rceil", "ocp", "oas")
OAS_FORMATS = ("e4m3", "e2m1")
ROUNDINGS = ("nearest", "stochastic", "ms_eden")
MS_EDEN_GROUP = 128
"""Elements per MS-EDEN correction group along the blocked axis: Quartet II's Hadamard
dimension (``fp8jax.quant.ms_eden``)."""
FOUR_OVER_SIX_RULES = ("mae", "mse")
FOUR_OVER_SIX_MAXES = (256, 448)


@dataclasses.dataclass(frozen=True)
class QuantSpec:
  """How to quantize one tensor role (activation, weight or gradient).

  Attributes:
    format: element format ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e4m3fnuz",
      "e5m2fnuz"; see ``fp8jax.numerics.formats``).
    granularity: which elements share a scale (see ``fp8jax.numerics.granularity``).
    scaling: "current" (amax of the tensor being quantized, per block) or "delayed"
      (per-tensor scale from an amax history of previous steps; see
      ``fp8jax.quant.delayed``).
    history_len: length of the amax history (delayed scaling only).
    history_reduce: "max" over the history or its "most_recent" entry.
    scale_format: "fp32" scales, "pow2" scales rounded by ``pow2_rounding`` (MX),
      "e4m3": two-level NVFP4 scales, E4M3 per block over an FP32 per-tensor scale
      (current scaling, margin 0), or "ue5m3": the same with unsigned E5M3 block scales
      under a tensor level that maps the amax to 6 x 114688, UE5M3's largest value
      (Transformer Engine PR #3325; 4-bit element formats only;
      ``fp8jax.numerics.ue5m3``).
    pow2_rounding: rule for power-of-two scales (default "floor"; must stay None
      with FP32 scales), by exponent arithmetic:
      "floor": s -> 2**floor(log2 s); never saturates (torchao's rule).
      "ceil": s -> 2**ceil(log2 s); may saturate up to a factor 2 near amax.
      "rceil": scale_inv = amax*2**margin/fp8_max is rounded UP to a power of two
        and s = 1/scale_inv (DeepGEMM's UE8M0 "ceil", NVIDIA's RCEIL, the MXFP8
        recipe's round-up rule); nothing saturates. Equal to "floor" except where the
        f32 reciprocal rounds across a power of two.
      "ocp": the OCP MX v1.0 rule (section 6.3): scale_inv =
        2**(floor(log2 amax) - emax of the element format); up to one binade of a
        block may saturate.
      "oas": overflow-aware scaling (arXiv 2603.08713, as google/qwix computes it):
        scale_inv = 2**floor(log2(bf16(amax / fp8_max * C))), C = 12/7 for E2M1 and
        60/31 for E4M3 (``scales.OAS_CONSTANTS``): the OCP exponent, one higher where the
        block maximum's mantissa would round past the format's top (amax / scale_inv in
        [3.5, 7) for E2M1, [231.47, 462.93) for E4M3).
      Every rule clamps the biased exponent to [1, 253], so s and scale_inv are
      normal powers of two in [2**-126, 2**126].
    store_e8m0: store ``scale_inv`` as ``float8_e8m0fnu`` (requires "pow2").
    rounding: "nearest" (ties to even), "stochastic" (needs a PRNG key or derives one
      from the input's bits, see ``fp8jax.quantize``) or "ms_eden": Quartet II's unbiased
      NVFP4 rounding through the block scales (arXiv 2601.22813; elements to nearest, each
      block's E4M3 scale corrected over groups of :data:`MS_EDEN_GROUP` elements and
      rounded stochastically; ``fp8jax.quant.ms_eden``). It needs E2M1 in 1 x 16 tiles
      along the last axis with two-level scales, and is unbiased over a random rotation
      of each group before it (the GEMM's ``rht_signs="step"``).
    sr_bits: random bits per element of stochastic rounding (ignored when rounding to
      nearest): 24 (default; unbiased to 2**-24 of a step) or 8, the rounding of
      Blackwell's ``cvt.rs`` FP4 conversion and of Transformer Engine's NVFP4 recipe,
      biased toward zero by up to 1/256 of a step (see
      ``formats.stochastic_round_to_format``; the ``nvfp4_sr`` preset and the
      ``nvfp4_recipe`` gradients use 8).
    eps: floor on the amax (``max(amax, eps)``). 0 is allowed: a block whose amax
      is then 0 uses s = 1, so an all-zero block always gives exact zeros. FP32
      scales are clamped to [2**-126, 2**126] so that s and 1/s stay finite.
    margin: extra headroom in [-64, 64]: s is divided by 2**margin.
    backward: spec used to quantize the cotangent in the backward pass of
      ``fake_quant``; None means straight-through (identity).
    four_over_six: None, or the error ("mae", Transformer Engine's default, or "mse") by
      which each NVFP4 block picks the scale that maps its maximum to 4 or to 6
      (Four Over Six, arXiv 2512.02010; ``fp8jax.numerics.four_over_six``). Needs
      ``scale_format="e4m3"`` and rounding to nearest.
    four_over_six_max: the E4M3 maximum in the per-tensor scale under Four Over Six: 256
      (TE's default; the 4-scales never clip) or 448.
    row_scaled: the FP32 second level of two-level scales per row instead of per tensor:
      one for each line of blocks along the tile's axis (each token of an activation
      [..., K] tiled along K), Transformer Engine's row-scaled NVFP4
      (``row_scaled_nvfp4``, PR #2931; ``fp8jax.numerics.scales``). Needs two-level scales
      and 1-D tiles. Off by default.
    noise_control: the noise-matched control of this quantization instead of the
      quantization itself: every block's rounding error is replaced by unbiased random
      noise of the same energy (see ``fp8jax.quant.noise_control``). Off by default.
  """

  format: str = "e4m3"
  granularity: gran.Granularity = gran.tile(128)
  scaling: str = "current"
  history_len: int = 1024
  history_reduce: str = "max"
  scale_format: str = "fp32"
  pow2_rounding: str | None = None
  store_e8m0: bool = False
  rounding: str = "nearest"
  sr_bits: int = 24
  eps: float = 1e-12
  margin: int = 0
  backward: QuantSpec | None = None
  four_over_six: str | None = None
  four_over_six_max: int = 256
  row_scaled: bool = False
  noise_control: bool = False

  def __post_init__(self):
    object.__setattr__(self, "format", formats.canonical_format_name(self.format))
    if not isinstance(self.granularity, gran.Granularity):
      raise TypeError(
          f"granularity must be an fp8jax Granularity, got {self.granularity!r}")
    _check_choice("scaling", self.scaling, SCALINGS)
    _check_choice("history_reduce", self.history_reduce, HISTORY_REDUCTIONS)
    _check_choice("scale_format", self.scale_format, SCALE_FORMATS)
    if self.scale_format == "fp32" and self.pow2_rounding is not None:
      raise ValueError(f"pow2_rounding={self.pow2_rounding!r} needs scale_format='pow2'")
    if self.scale_format == "pow2":
      object.__setattr__(self, "pow2_rounding", self.pow2_rounding or "floor")
      _check_choice("pow2_rounding", self.pow2_rounding, POW2_ROUNDINGS)
      if self.pow2_rounding == "oas" and self.format not in OAS_FORMATS:
        raise ValueError(f"pow2_rounding='oas' has constants for {OAS_FORMATS} only, got "
                         f"format {self.format!r}")
    _check_choice("rounding", self.rounding, ROUNDINGS)
    if self.rounding == "ms_eden":
      g = self.granularity
      if (self.format, self.scale_format, g.kind, g.axes, g.sizes) != (
          "e2m1", "e4m3", "tile", (-1,), (16,)):
        raise ValueError("rounding='ms_eden' is Quartet II's NVFP4 rounding: it needs format "
                         "'e2m1', scale_format='e4m3' and tile(16) along the last axis, got "
                         f"{self.format!r}, {self.scale_format!r}, {g.describe()}")
    if type(self.sr_bits) is not int or self.sr_bits not in formats.SR_BITS:
      raise ValueError(f"sr_bits must be one of {formats.SR_BITS}, got {self.sr_bits!r}")
    if self.scale_format in TWO_LEVEL:
      if self.scaling != "current":
        raise ValueError(f"two-level {self.scale_format} scales (NVFP4) need current scaling")
      if self.margin != 0:
        raise ValueError(f"two-level {self.scale_format} scales (NVFP4) take no margin, got "
                         f"{self.margin}")
    if self.scale_format == "ue5m3" and self.fmt.bits != 4:
      raise ValueError(f"scale_format='ue5m3' is NVFP4's UE5M3 block scale: it needs a 4-bit "
                       f"element format, got {self.format!r}")
    if not isinstance(self.row_scaled, bool):
      raise TypeError(f"row_scaled must be a bool, got {self.row_scaled!r}")
    if self.row_scaled and (self.scale_format not in TWO_LEVEL
                            or self.granularity.kind != "tile" or self.rounding == "ms_eden"):
      raise ValueError("row_scaled sets the FP32 level of two-level scales per row: it needs "
                       f"scale_format in {TWO_LEVEL}, 1-D tiles and no MS-EDEN, got "
                       f"{self.scale_format!r}, {self.granularity.describe()}, "
                       f"{self.rounding!r}")
    if self.four_over_six is not None:
      _check_choice("four_over_six", self.four_over_six, FOUR_OVER_SIX_RULES)
      if self.scale_format != "e4m3" or self.format != "e2m1":
        raise ValueError("four_over_six picks two-level NVFP4 block scales: it needs "
                         f"scale_format='e4m3' and format 'e2m1', got {self.scale_format!r} "
                         f"and {self.format!r}")
      if self.rounding != "nearest":
        raise ValueError("four_over_six compares round-to-nearest errors: it needs "
                         f"rounding='nearest', got {self.rounding!r}")
    if self.four_over_six_max not in FOUR_OVER_SIX_MAXES or isinstance(
        self.four_over_six_max, bool):
      raise ValueError(f"four_over_six_max must be one of {FOUR_OVER_SIX_MAXES}, got "
                       f"{self.four_over_six_max!r}")
    if self.four_over_six is None and self.four_over_six_max != 256:
      raise ValueError("four_over_six_max applies to four_over_six only")
    if self.rounding != "nearest" and self.scaling != "current":
      raise ValueError(f"rounding={self.rounding!r} is available with current scaling only")
    for name in ("store_e8m0", "noise_control"):
      if not isinstance(getattr(self, name), bool):
        raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
    if self.scaling == "current" and (self.history_len, self.history_reduce) != (1024, "max"):
      raise ValueError("history_len and history_reduce apply to delayed scaling only")
    if self.scaling == "delayed" and self.granularity.kind != "tensor":
      raise ValueError(
          "delayed scaling is per-tensor only; got granularity "
          f"{self.granularity.describe()} (use per_tensor() or current scaling)")
    if not isinstance(self.history_len, int) or self.history_len < 1:
      raise ValueError(f"history_len must be a positive integer, got {self.history_len!r}")
    if self.store_e8m0 and self.scale_format != "pow2":
      raise ValueError("store_e8m0=True needs scale_format='pow2': E8M0 holds only "
                       "powers of two")
    if not isinstance(self.eps, (int, float)):
      raise TypeError(f"eps must be a number, got {self.eps!r}")
    eps = float(self.eps)
    if not math.isfinite(eps) or eps < 0:
      raise ValueError(f"eps must be a finite number >= 0, got {self.eps}")
    object.__setattr__(self, "eps", eps)
    if not isinstance(self.margin, int) or not -64 <= self.margin <= 64:
      raise ValueError(f"margin must be an integer in [-64, 64], got {self.margin!r}")
    if self.backward is not None:
      if not isinstance(self.backward, QuantSpec):
        raise TypeError(f"backward must be a QuantSpec or None, got {self.backward!r}")
      if self.backward.backward is not None:
        raise ValueError("a backward (cotangent) spec cannot have a backward spec itself")

  @property
  def two_level(self) -> bool:
    """Whether the scales are two-level (block scales over an FP32 tensor or row level)."""
    return self.scale_format in TWO_LEVEL

  @property
  def fmt(self) -> formats.FloatFormat:
    """The element format's static facts."""
    return formats.get_format(self.format)

  def replace(self, **changes) -> QuantSpec:
    """A copy with ``changes`` applied (validated again)."""
    return dataclasses.replace(self, **changes)

  def describe(self) -> str:
    """Short name for tables, e.g. ``e4m3 1x128@-1 current fp32``."""
    scale = self.scale_format
    if scale == "pow2":
      scale += f"/{self.pow2_rounding}" + ("/e8m0" if self.store_e8m0 else "")
    elif scale in TWO_LEVEL:
      scale += "+fp32" + ("/row" if self.row_scaled else "")
    text = f"{self.format} {self.granularity.describe()} {self.scaling} {scale}"
    if self.rounding == "stochastic":
      text += " sr" if self.sr_bits == 24 else f" sr{self.sr_bits}"
    elif self.rounding == "ms_eden":
      text += " ms-eden"
    if self.four_over_six:
      text += f" 4/6-{self.four_over_six}" + (
          f"@{self.four_over_six_max}" if self.four_over_six_max != 256 else "")
    if self.noise_control:
      text += " noise-control"
    if self.backward is not None:
      text += f" | bwd {self.backward.describe()}"
    return text


def _check_choice(field: str, value, choices):
  if value not in choices:
    raise ValueError(f"unknown {field} {value!r}; choose one of {choices}")
