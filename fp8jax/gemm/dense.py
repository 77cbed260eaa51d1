"""A simulated FP8 `dot_general` with the DeepSeek-V3 blockwise recipe.

``fp8_dot_general(x, w, dimension_numbers, config=...)`` is a drop-in ``dot_general``
(Flax ``Dense``/``nnx.Linear``, ``jnp.einsum(..., _dot_general=...)``) whose left
operand plays the *input* role and right operand the *weight* role. With
``Y = X W`` it computes, each direction independently in BF16, simulated FP8 or real
FP8 (per-tensor scales, ``lax.dot_general`` on float8 operands):

* Fprop: ``Y  = Q_in(X) . Q_w(W)``
* Dgrad: ``dX = Q_grad(dY) . Q_w'(W^T)``
* Wgrad: ``dW = Q_in'(X^T) . Q_grad'(dY^T)``

(the primed copies with their own specs where ``config.roles`` gives them, else the
role's; see ``fp8jax.gemm.operands``)

Operands are brought to *contraction-last* layout [B, rows, K] (batch dims first, free
dims flattened) and every role's spec is applied in that layout, so ``tile(128)`` means
1x128 tiles along each GEMM's contraction axis and ``block((128, 128))`` blocks of the
weight matrix. The transposed operands of the backward GEMMs (W^T for Dgrad, X^T and dY^T
for Wgrad) come from ``config.transpose`` (see ``fp8jax.gemm.transpose``). Accumulation and
the per-interval application of scales are in ``fp8jax.gemm.accumulate``.

With ``wgrad_hadamard=n`` the Wgrad operands X^T and dY^T are multiplied along the tokens
by the random Hadamard transform (``fp8jax.gemm.hadamard``; Transformer Engine's signs and
BF16 precision unless ``rht_signs`` / ``rht_dtype`` say otherwise) before they are
quantized, as the NVFP4 recipe does. Stochastic-rounding specs draw their bits from keys
derived from the operand (``fp8jax.quant.rounding_bits``), a separate stream per GEMM.
Recipes by name are in ``fp8jax.gemm.recipes``.

Memory: the high-precision X and W are saved for the backward pass and re-quantized
there (the same bits as in the forward pass).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from fp8jax.gemm import accumulate, hadamard, operands, rotation, transpose
from fp8jax.numerics import arguments
from fp8jax.numerics import roles as roles_lib
from fp8jax.quant import qtensor, rounding_bits

PRECISIONS = ("bf16", "fp8", "fp8_native")
_OPERAND_ROLES = {"fprop": ("input", "weight"), "dgrad": ("grad", "weight"),
                  "wgrad": ("grad", "input")}


@dataclasses.dataclass(frozen=True)
class GemmConfig:
  """Static, hashable description of one simulated FP8 linear layer.

  Attributes:
    roles: per-role quantization specs (input X, weight W, output gradient dY), and
      optionally the specs of the backward copies W^T (Dgrad), X^T and dY^T (Wgrad):
      :class:`~fp8jax.numerics.roles.RoleSpecs`.
    fprop, dgrad, wgrad: "bf16", "fp8" (simulated) or "fp8_native" (real FP8
      ``lax.dot_general``; per-tensor scales only).
    accumulation: accumulator model of the simulated FP8 GEMMs. The default, FP32 (also
      that of :func:`fp8_dot_general`, :func:`fp8_einsum` and ``fp8_ragged_dot``), leaves
      the operands' quantization as the only error and runs as plain dots (or the Pallas
      kernels); the tensor-core model (``accumulate.HOPPER``, recipe
      ``hopper_blockwise``) is a slower scan, asked for by name.
    transpose: how transposed operands are produced: "requant", "double",
      "scaling_aware".
    wgrad_hadamard: block size of the random Hadamard transform applied to the Wgrad
      operands along the tokens (16 in the NVFP4 recipe); 0 = none.
    rht_gemms: the GEMMs whose two operands that transform rotates along their
      contraction axis (``fp8jax.gemm.rotation``): "wgrad" (default), "backward" (Dgrad
      too: Quartet II) or "all" (Fprop too: UFP4).
    backward_from_forward: Dgrad's W^T and Wgrad's X^T are re-quantized with the grad spec
      from the forward pass's quantized W and X (Quartet II: MS-EDEN for all four backward
      operands); needs ``rht_gemms`` "backward" or "all".
    from_forward: the tensors ("input", "weight") whose backward copy (X^T, W^T) is
      quantized from Fprop's quantized X or W, dequantized, instead of from the original
      (Transformer Engine's ``columnwise_source="rowwise_dequantized"``; default ():
      none; ``fp8jax.gemm.operands``).
    rht_signs: the transform's sign vector (``fp8jax.gemm.hadamard``): "te" (default;
      Transformer Engine's fixed 16 signs, size 16 only), "random" (drawn from
      ``hadamard_seed``), "none", or "step": drawn for every call from a key derived from
      the GEMM's input (``fp8jax.gemm.rotation.signs``).
    rht_dtype: precision of the transform: "bfloat16" (default; Transformer Engine's:
      operands and result rounded to bfloat16, FP32 sums) or "float32".
    hadamard_seed: seed of the transform's signs with ``rht_signs="random"``.
    impl: implementation of the FP32-accumulation products (the results agree to float32
      rounding): "auto" (the Pallas kernels on one GPU where the scales suit them, else
      XLA; :mod:`fp8jax.kernels.placement`), "xla", or "pallas" (the kernels, interpreted
      off GPU; the dense GEMM refuses scales its kernel does not take, the grouped GEMM
      runs those in XLA). Part of the config, so a jitted function traces once per choice.
    fp8_mma: the Pallas blockwise kernels (dense and grouped, all three directions)
      multiply E4M3 (or E5M2) payloads of one format on the FP8 tensor cores instead of
      as exact bfloat16 products summed in float32: each MMA instruction's 32 products
      are summed by the tensor core (its alignment and truncation), then added in float32
      (promotion after every instruction, not DeepGEMM's every 4). Faster than the
      bfloat16 products (docs/performance/archive/2026-11-26_grouped_blockwise_fp8_dots.md)
      and near the exact sums (99.94% of outputs bit-equal at 2048 tokens), but not bit
      for bit; see
      ``grouped_scaled_pallas.grouped_scaled_matmul(fp8_dots=)``. The grouped Wgrad then
      takes its operands transposed, the layout the FP8 MMA reads. FP32 accumulation
      only. It acts only where a kernel runs on such payloads; elsewhere (XLA, other
      formats, the interpreter) the products stay exact, summed in float32.
  """

  roles: roles_lib.RoleSpecs = roles_lib.deepseek_v3_roles()
  fprop: str = "fp8"
  dgrad: str = "fp8"
  wgrad: str = "fp8"
  accumulation: accumulate.Accumulation = accumulate.FP32
  transpose: str = "requant"
  wgrad_hadamard: int = 0
  rht_gemms: str = "wgrad"
  backward_from_forward: bool = False
  from_forward: tuple[str, ...] = ()
  rht_signs: str = "te"
  rht_dtype: str = "bfloat16"
  hadamard_seed: int = 0
  impl: str = "auto"
  fp8_mma: bool = False

  def __post_init__(self):
    accumulate.check_impl(self.impl, "GemmConfig impl")
    h = self.wgrad_hadamard
    if not isinstance(h, int) or h < 0 or (h and h & (h - 1)):
      raise ValueError(f"wgrad_hadamard must be 0 or a power of two, got {h!r}")
    hadamard.check_options(h or len(hadamard.TE_SIGNS),
                           "none" if self.rht_signs == "step" else self.rht_signs,
                           self.rht_dtype)
    if self.rht_gemms not in rotation.RHT_GEMMS:
      raise ValueError(f"unknown rht_gemms {self.rht_gemms!r}; choose one of "
                       f"{tuple(rotation.RHT_GEMMS)}")
    if self.backward_from_forward is not False and (
        self.backward_from_forward is not True or not h or self.rht_gemms == "wgrad"):
      raise ValueError("backward_from_forward (a bool) re-quantizes the rotated backward "
                       "operands: it needs wgrad_hadamard and rht_gemms 'backward' or 'all'")
    if h and self.rht_gemms == "all" and "block" in (
        self.roles.weight.granularity.kind,
        self.roles.operand("dgrad", "weight").granularity.kind):
      raise ValueError("rht_gemms='all' rotates W along K for Fprop and along N for Dgrad: "
                       "its blocks cannot be 2-D (one quantized weight for both)")
    if h and self.transpose != "requant":
      raise ValueError("the Wgrad Hadamard transform quantizes the transformed high-precision "
                       f"operands: it needs transpose='requant', got {self.transpose!r}")
    if not isinstance(self.roles, roles_lib.RoleSpecs):
      raise TypeError(f"roles must be a RoleSpecs, got {self.roles!r}")
    operands.check(self)
    if not isinstance(self.accumulation, accumulate.Accumulation):
      raise TypeError(f"accumulation must be an Accumulation, got {self.accumulation!r}")
    if self.impl == "pallas" and self.accumulation.mode != "fp32":
      raise ValueError("impl='pallas': the Pallas kernels implement FP32 accumulation only, "
                       f"got accumulation {self.accumulation.describe()}")
    if self.fp8_mma and (self.accumulation.mode != "fp32" or self.impl == "xla"):
      raise ValueError("fp8_mma runs the Pallas kernels' products on the FP8 tensor cores: "
                       f"it needs FP32 accumulation and impl 'auto' or 'pallas', got "
                       f"{self.accumulation.describe()} and impl={self.impl!r}")
    if self.transpose not in transpose.POLICIES:
      raise ValueError(f"unknown transpose policy {self.transpose!r}; choose one of "
                       f"{transpose.POLICIES}")
    for direction in _OPERAND_ROLES:
      mode = getattr(self, direction)
      if mode not in PRECISIONS:
        raise ValueError(f"unknown {direction} precision {mode!r}; choose one of {PRECISIONS}")
      for role in _OPERAND_ROLES[direction]:
        spec = self.roles.operand(direction, role)
        if mode != "bf16" and spec.scaling != "current":
          raise ValueError(f"{direction}: the {role} spec uses {spec.scaling} scaling; the "
                           "GEMM simulation supports current scaling")
        if mode == "fp8_native" and (spec.fmt.bits != 8 or spec.scale_format == "e4m3"):
          raise ValueError(f"{direction}=fp8_native needs an FP8 format with one-level scales; "
                           f"the {role} spec is {spec.describe()}")
        if mode == "fp8_native" and spec.granularity.kind != "tensor":
          raise ValueError(f"{direction}=fp8_native needs per-tensor scales, but the {role} "
                           f"spec is {spec.granularity.describe()}")

  def replace(self, **changes) -> GemmConfig:
    return dataclasses.replace(self, **changes)

  def describe(self) -> str:
    modes = "/".join(getattr(self, d) for d in _OPERAND_ROLES)
    text = f"{modes} acc={self.accumulation.describe()} transpose={self.transpose}"
    if self.wgrad_hadamard:
      text += f" rht={self.wgrad_hadamard}"
      text += "" if self.rht_signs == "te" else f"/{self.rht_signs}"
      text += "" if self.rht_dtype == "bfloat16" else f"/{self.rht_dtype}"
      text += "" if self.rht_gemms == "wgrad" else f"/{self.rht_gemms}"
      text += "/from-forward" if self.backward_from_forward else ""
    text += operands.describe(self)
    text += " fp8_mma" if self.fp8_mma else ""
    return text + (f" impl={self.impl}" if self.impl != "auto" else "")


BF16 = GemmConfig(fprop="bf16", dgrad="bf16", wgrad="bf16")
FP32_BLOCKWISE = GemmConfig()  # DeepSeek-V3 roles, FP32 accumulation
HOPPER_BLOCKWISE = GemmConfig(accumulation=accumulate.HOPPER)
"""DeepSeek-V3's roles with the Hopper tensor-core accumulator model: the recipe
``recipes.recipe("hopper_blockwise")``."""
DEEPSEEK_V3 = HOPPER_BLOCKWISE
"""Deprecated alias of :data:`HOPPER_BLOCKWISE` (the same recipe), kept for one release."""


def check_config(config, fn: str) -> GemmConfig:
  """``config`` when it is a :class:`GemmConfig`, else a TypeError naming ``fn``."""
  return arguments.named(config, GemmConfig, "config", fn, "fp8jax.recipe", "recipe",
                         "fp32_blockwise")


def _dims(dimension_numbers, lhs, rhs):
  """``((lc, rc), (lb, rb))`` as tuples of non-negative ints, checked against the ranks."""
  try:
    (lc, rc), (lb, rb) = dimension_numbers
    lc, rc, lb, rb = (tuple(int(d) for d in v) for v in (lc, rc, lb, rb))
  except (TypeError, ValueError):
    raise ValueError(
        "fp8_dot_general: dimension_numbers must be ((lhs_contract, rhs_contract), "
        f"(lhs_batch, rhs_batch)) as in lax.dot_general, got {dimension_numbers!r}") from None
  out = []
  for dims, x, side in ((lc, lhs, "lhs"), (rc, rhs, "rhs"), (lb, lhs, "lhs"), (rb, rhs, "rhs")):
    if any(not -x.ndim <= d < x.ndim for d in dims):
      raise ValueError(f"fp8_dot_general: dimension_numbers {dimension_numbers!r} names an "
                       f"axis outside {side} of rank {x.ndim}")
    out.append(tuple(d % x.ndim for d in dims))
  return out


# --- layout ------------------------------------------------------------------------


def _to_contraction_last(x, contract, batch):
  """x -> ([B, R, K], permutation, transposed shape)."""
  free = [d for d in range(x.ndim) if d not in contract and d not in batch]
  perm = tuple(batch) + tuple(free) + tuple(contract)
  xt = jnp.transpose(x, perm)
  sizes = [x.shape[d] for d in perm]
  nb, nf = len(batch), len(free)
  shape3 = (math.prod(sizes[:nb]), math.prod(sizes[nb:nb + nf]), math.prod(sizes[nb + nf:]))
  return xt.reshape(shape3), [x.shape[d] for d in free], [x.shape[d] for d in batch]


# --- the three GEMMs on contraction-last operands -----------------------------------


def _bf16_matmul(a, bt):
  return jnp.einsum("bmk,bnk->bmn", a.astype(jnp.bfloat16), bt.astype(jnp.bfloat16),
                    preferred_element_type=jnp.float32)


def _fp8_matmul(aq, btq, cfg, mode):
  if mode == "fp8_native":
    y = jnp.einsum("bmk,bnk->bmn", aq.data, btq.data, preferred_element_type=jnp.float32)
    scale = aq.scale_inv.astype(jnp.float32) * btq.scale_inv.astype(jnp.float32)
    return y * scale.reshape(())
  return accumulate.scaled_matmul(aq, btq, cfg.accumulation, cfg.impl, cfg.fp8_mma)


def wgrad_transform(v, cfg: GemmConfig):
  """The config's Hadamard transform of a Wgrad operand along its last axis (the tokens)."""
  return hadamard.random_hadamard(v, cfg.wgrad_hadamard, signs=cfg.rht_signs,
                                  seed=cfg.hadamard_seed, dtype=cfg.rht_dtype)


def operand_key(x, spec, stream: int):
  """The stochastic-rounding key of one GEMM operand (derived from its bits), or None."""
  if spec.rounding != "stochastic":
    return None
  return rounding_bits.content_key(x, stream)


def _fprop(x3, w3, cfg):
  if cfg.fprop == "bf16":
    return _bf16_matmul(x3, w3)
  if rotation.on(cfg, "fprop"):
    x3, w3 = rotation.fprop_operands(x3, w3, cfg)
  xq = qtensor.quantize(x3, cfg.roles.input, key=operand_key(x3, cfg.roles.input, 1))
  wq = qtensor.quantize(w3, cfg.roles.weight, key=operand_key(w3, cfg.roles.weight, 2))
  return _fp8_matmul(xq, wq, cfg, cfg.fprop)


def _dgrad(dy3, w3, cfg):
  """dX [B, M, K] = dY [B, M, N] . W [B, N, K]."""
  w_t = jnp.swapaxes(w3, -1, -2)
  if cfg.dgrad == "bf16":
    return _bf16_matmul(dy3, w_t)
  r = cfg.roles
  if rotation.on(cfg, "dgrad"):
    return _fp8_matmul(*rotation.dgrad_operands(dy3, w_t, cfg), cfg, cfg.dgrad)
  wq = qtensor.quantize(w3, r.weight, key=operand_key(w3, r.weight, 2))  # as Fprop's
  wtq = operands.second_copy(w3, wq, cfg, "weight", w_t, 3)
  dyq = qtensor.quantize(dy3, r.grad, key=operand_key(dy3, r.grad, 4))
  return _fp8_matmul(dyq, wtq, cfg, cfg.dgrad)


def _wgrad(dy3, x3, cfg):
  """dW [B, N, K] = dY^T [B, N, M] . X [B, M, K]."""
  if cfg.wgrad == "bf16":
    return _bf16_matmul(jnp.swapaxes(dy3, -1, -2), jnp.swapaxes(x3, -1, -2))
  r = cfg.roles
  if cfg.wgrad_hadamard:  # quantize the transformed operands [B, N|K, M_pad]
    xtq, dytq = rotation.wgrad_operands(x3, dy3, cfg)
    return _fp8_matmul(dytq, xtq, cfg, cfg.wgrad)
  dyq = qtensor.quantize(dy3, r.grad, key=operand_key(dy3, r.grad, 4))  # as Dgrad's
  xq = qtensor.quantize(x3, r.input, key=operand_key(x3, r.input, 1))  # as Fprop's
  dytq = operands.second_copy(dy3, dyq, cfg, "grad", dy3, 5)
  xtq = operands.second_copy(x3, xq, cfg, "input", x3, 6)
  return _fp8_matmul(dytq, xtq, cfg, cfg.wgrad)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gemm3(x3, w3, cfg):
  return _fprop(x3, w3, cfg)


def _gemm3_fwd(x3, w3, cfg):
  return _fprop(x3, w3, cfg), (x3, w3)


def _gemm3_bwd(cfg, res, dy3):
  x3, w3 = res
  dy3 = dy3.astype(jnp.float32)
  return (_dgrad(dy3, w3, cfg).astype(x3.dtype), _wgrad(dy3, x3, cfg).astype(w3.dtype))


_gemm3.defvjp(_gemm3_fwd, _gemm3_bwd)


# --- public entry points -------------------------------------------------------------


def fp8_dot_general(lhs, rhs, dimension_numbers, precision=None,
                    preferred_element_type=None, *, config: GemmConfig = FP32_BLOCKWISE,
                    **unused_kwargs):
  """``lax.dot_general`` with simulated FP8 GEMMs in forward and backward.

  Args:
    lhs: activations X (the "input" role), any shape.
    rhs: weights W (the "weight" role), any shape.
    dimension_numbers: ``((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))`` as in
      ``lax.dot_general``.
    precision: ignored (the FP8 paths define their own arithmetic).
    preferred_element_type: output dtype; default ``result_type(lhs, rhs)``.
    config: the :class:`GemmConfig`; default the DeepSeek-V3 roles with FP32
      accumulation, as ``GemmConfig()`` and ``fp8_ragged_dot`` (see ``accumulation`` there).
    **unused_kwargs: accepted for API compatibility (e.g. ``out_sharding``) and ignored.

  Returns:
    The product with ``lax.dot_general``'s output layout: batch, lhs free, rhs free.
  """
  del precision, unused_kwargs
  config = check_config(config, "fp8_dot_general")
  lhs = arguments.array(lhs, "lhs", "fp8_dot_general")
  rhs = arguments.array(rhs, "rhs", "fp8_dot_general")
  lc, rc, lb, rb = _dims(dimension_numbers, lhs, rhs)
  if [lhs.shape[d] for d in lc] != [rhs.shape[d] for d in rc]:
    raise ValueError(f"contracting dims differ: lhs {lhs.shape} on {lc}, rhs {rhs.shape} "
                     f"on {rc}")
  if [lhs.shape[d] for d in lb] != [rhs.shape[d] for d in rb]:
    raise ValueError(f"batch dims differ: lhs {lhs.shape} on {lb}, rhs {rhs.shape} on {rb}")
  out_dtype = preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype)
  x3, x_free, batch = _to_contraction_last(lhs, lc, lb)
  w3, w_free, _ = _to_contraction_last(rhs, rc, rb)
  y3 = _gemm3(x3, w3, config)
  return y3.reshape(batch + x_free + w_free).astype(out_dtype)


def dot_general_fn(config: GemmConfig):
  """A ``dot_general`` callable bound to ``config`` (for Flax layers and einsum)."""
  return functools.partial(fp8_dot_general, config=check_config(config, "dot_general_fn"))


def fp8_einsum(subscripts: str, lhs, rhs, *, config: GemmConfig = FP32_BLOCKWISE,
               preferred_element_type=None):
  """Two-operand ``jnp.einsum`` through :func:`fp8_dot_general` (lhs = input role)."""
  config = check_config(config, "fp8_einsum")
  return jnp.einsum(subscripts, lhs, rhs, preferred_element_type=preferred_element_type,
                    _dot_general=dot_general_fn(config))
