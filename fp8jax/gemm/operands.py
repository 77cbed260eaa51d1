"""The six operand copies of a :class:`~fp8jax.gemm.dense.GemmConfig`: where each backward
copy comes from, and the combinations a config refuses.

A linear layer's three GEMMs read six quantized copies: X and W (Fprop), dY and W^T
(Dgrad), X^T and dY^T (Wgrad), each with its spec from ``config.roles.operand(gemm,
role)`` (:class:`fp8jax.numerics.roles.RoleSpecs`). The second copy of a tensor is
quantized from the high-precision original by the config's ``transpose`` policy, or, for
the tensors named in ``config.from_forward``, from the first copy's values: X^T from X as
Fprop quantized it, W^T from Fprop's W, dequantized to float32 and quantized again with
the second copy's spec (Transformer Engine's ``HybridQuantizer(columnwise_source=
"rowwise_dequantized")``, PR #2817; the ``double`` transpose of that one tensor).
"""

from __future__ import annotations

import jax

from fp8jax.gemm import transpose
from fp8jax.numerics import roles as roles_lib
from fp8jax.quant import qtensor, rounding_bits

FROM_FORWARD_ROLES = ("input", "weight")
"""The tensors ``from_forward`` may name: the forward operands (TE applies its
``rowwise_dequantized`` source to those, never to gradients)."""
_SECOND = {"input": ("wgrad", "X^T", "X"), "weight": ("dgrad", "W^T", "W"),
           "grad": ("wgrad", "dY^T", "dY")}
_FIRST = {"input": "fprop", "weight": "fprop", "grad": "dgrad"}


def transpose_policy(cfg, role: str) -> str:
  """How the second copy of ``role`` is made (``fp8jax.gemm.transpose``): "double" (from
  the first copy's values) where ``cfg.from_forward`` names it, else ``cfg.transpose``."""
  return "double" if role in cfg.from_forward else cfg.transpose


def second_copy(x_hp: jax.Array, first: qtensor.QTensor, cfg, role: str,
                key_of: jax.Array, stream: int) -> qtensor.QTensor:
  """The second copy of ``role`` (W^T for Dgrad, X^T or dY^T for Wgrad) [..., C, R]: the
  quantization of ``swapaxes(x_hp, -1, -2)`` with that copy's spec, by
  :func:`transpose_policy` from the original ``x_hp`` [..., R, C] or from the first copy
  ``first``; a stochastic-rounding spec draws from a key derived from ``key_of`` and
  ``stream`` (as ``fp8jax.gemm.dense.operand_key``)."""
  spec = cfg.roles.operand(_SECOND[role][0], role)
  key = rounding_bits.content_key(key_of, stream) if spec.rounding == "stochastic" else None
  return transpose.transposed(x_hp, first, spec, transpose_policy(cfg, role), key)


def second_copy_columns(x: jax.Array, cfg, role: str) -> qtensor.QTensor:
  """:func:`second_copy` from the original ``x`` [..., R, C] left in its layout
  (``transpose.quantize_columns``: the blocks of the copy's spec with the last two axes
  exchanged; round to nearest)."""
  return transpose.quantize_columns(x, cfg.roles.operand(_SECOND[role][0], role))


def second_copies_differ(cfg, role: str) -> bool:
  """Whether the second copy of ``role`` is not the first one's quantization transposed:
  its own spec differs from the first copy's, or it is made from the first copy's values."""
  gemm = _SECOND[role][0]
  return (role in cfg.from_forward
          or cfg.roles.operand(gemm, role) != cfg.roles.operand(_FIRST[role], role))


def check(cfg) -> None:
  """Raises ValueError (one line, naming the problem) for a combination of copies,
  sources and options that ``cfg`` cannot run."""
  roles, ff = cfg.roles, cfg.from_forward
  if (not isinstance(ff, tuple) or len(set(ff)) != len(ff)
      or any(r not in FROM_FORWARD_ROLES for r in ff)):
    raise ValueError(f"from_forward takes a tuple of distinct roles among "
                     f"{FROM_FORWARD_ROLES} (forward operands only, as Transformer Engine's "
                     f"rowwise_dequantized source), got {ff!r}")
  if cfg.backward_from_forward and (ff or roles.dgrad_weight is not None
                                   or roles.wgrad_input is not None):
    raise ValueError("backward_from_forward already re-quantizes X^T and W^T from the forward "
                     "pass with the grad spec: leave from_forward, dgrad_weight and "
                     "wgrad_input unset with it")
  for role in ff:
    gemm, copy, tensor = _SECOND[role]
    spec = roles.spec(role)
    if cfg.fprop == "bf16" or getattr(cfg, gemm) == "bf16":
      raise ValueError(f"from_forward={role!r} quantizes {copy} from Fprop's quantized "
                       f"{tensor}: it needs fprop and {gemm} in FP8, got "
                       f"{cfg.fprop}/{getattr(cfg, gemm)}")
    if spec.rounding != "nearest":
      raise ValueError(f"from_forward={role!r} needs a forward {role} spec that rounds to "
                       f"nearest (one forward {tensor} for every GEMM path), got "
                       f"{spec.describe()}")
    if cfg.wgrad_hadamard and cfg.rht_gemms == "all":
      raise ValueError(f"from_forward={role!r}: rht_gemms='all' quantizes {tensor} rotated "
                       f"along K for Fprop, which {copy} cannot be re-quantized from")
  if cfg.transpose == "scaling_aware":
    for role in ("input", "weight", "grad"):
      gemm, copy, tensor = _SECOND[role]
      first, second = roles.operand(_FIRST[role], role), roles.operand(gemm, role)
      if role not in ff and (first.format, first.scale_format) != (second.format,
                                                                   second.scale_format):
        raise ValueError(f"transpose='scaling_aware' re-expresses {tensor}'s payload in "
                         f"{copy}'s blocks: {copy} needs {tensor}'s format and scale format "
                         f"({first.format}, {first.scale_format}), got {second.format}, "
                         f"{second.scale_format}")


def describe(cfg) -> str:
  """`` copies=NAME,..`` for the second copies with their own specs and `` from-forward=
  ROLE,..``, or ""."""
  own = [n for n in roles_lib.OVERRIDES if getattr(cfg.roles, n) is not None]
  text = f" copies={','.join(own)}" if own else ""
  return text + (f" from-forward={','.join(cfg.from_forward)}" if cfg.from_forward else "")


__all__ = ["FROM_FORWARD_ROLES", "check", "describe", "second_copies_differ", "second_copy",
           "second_copy_columns", "transpose_policy"]
