"""Random Hadamard rotations of a GEMM's two operands along its contraction axis, for the
GEMMs a :class:`~fp8jax.gemm.dense.GemmConfig` names (``rht_gemms``), and Quartet II's
backward operands re-quantized from the forward's (``backward_from_forward``).

``(A Q)(B Q)^T = A B^T`` for the orthogonal block-diagonal ``Q`` of
:mod:`fp8jax.gemm.hadamard` (blocks ``diag(s) H_n / sqrt(n)``, ``n = wgrad_hadamard``),
so each GEMM may quantize its operands rotated along the contraction axis: Wgrad along the
tokens (the NVFP4 recipe), Dgrad along N and Fprop along K as well (``rht_gemms``
"backward": Quartet II, arXiv 2601.22813; "all": UFP4, arXiv 2606.20381).

Signs ``rht_signs="step"``: a ±1 vector drawn for every call from a key derived from the
GEMM's first operand (X for Fprop, dY for Dgrad and Wgrad: each new step's tensors give new
signs), shared by the GEMM's two operands. Quartet II draws one vector per backward pass
(``rerotate_hadamard``); here Dgrad and Wgrad of the dense GEMM derive theirs from the same
dY and so draw the same, and the grouped GEMM's Wgrad from dY in its padded layout.

``backward_from_forward``: Dgrad's W^T and Wgrad's X^T are the forward pass's quantized W
and X, dequantized, rotated and quantized again with the grad spec: Quartet II keeps the
forward's NVFP4 operands for the backward pass and re-quantizes all four backward operands
with MS-EDEN (``schemes/quartet_2.py``, ``Quartet_II_fn.backward``). ``from_forward``
does the same for the tensors it names, with their backward copies' own specs
(``fp8jax.gemm.operands``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp8jax.gemm import hadamard
from fp8jax.quant import qtensor, rounding_bits

RHT_GEMMS = {"wgrad": ("wgrad",), "backward": ("dgrad", "wgrad"),
             "all": ("fprop", "dgrad", "wgrad")}
"""``GemmConfig.rht_gemms``: the GEMMs whose operands the transform rotates."""
_SIGN_STREAM = 11


def on(cfg, gemm: str) -> bool:
  """Whether ``cfg`` rotates the operands of ``gemm`` ("fprop", "dgrad" or "wgrad")."""
  return bool(cfg.wgrad_hadamard) and gemm in RHT_GEMMS[cfg.rht_gemms]


def signs(cfg, source: jax.Array) -> jax.Array | None:
  """The ±1 float32 vector [n] of ``rht_signs="step"``, from a key derived from
  ``source``; None for the fixed signs of the other choices."""
  if cfg.rht_signs != "step":
    return None
  bits = jax.random.bits(rounding_bits.content_key(source, _SIGN_STREAM),
                         (cfg.wgrad_hadamard,), jnp.uint32)
  return jnp.where((bits & 1) == 1, jnp.float32(-1.0), jnp.float32(1.0))


def rotate(v: jax.Array, cfg, s: jax.Array | None = None) -> jax.Array:
  """``v`` [..., T] rotated along its last axis (zero-padded to whole blocks): the
  config's transform, with the drawn signs ``s`` where given."""
  n = cfg.wgrad_hadamard
  if s is None:
    return hadamard.random_hadamard(v, n, signs=cfg.rht_signs, seed=cfg.hadamard_seed,
                                    dtype=cfg.rht_dtype)
  t = v.shape[-1]
  t_pad = -(-t // n) * n
  v = jnp.pad(v.astype(jnp.float32), [(0, 0)] * (v.ndim - 1) + [(0, t_pad - t)])
  v = v * jnp.tile(s, t_pad // n)  # exact: a sign flip, before the Hadamard matrix mixes
  return hadamard.random_hadamard(v, n, signs="none", dtype=cfg.rht_dtype)


def pair(a: jax.Array, b: jax.Array, cfg, source: jax.Array):
  """``a`` and ``b`` rotated along their last axes with one draw of signs."""
  s = signs(cfg, source)
  return rotate(a, cfg, s), rotate(b, cfg, s)


def _swap(v):
  return jnp.swapaxes(v, -1, -2)


def forward_values(v: jax.Array, spec, stream: int) -> jax.Array:
  """``v`` as the forward pass quantized it (float32): what Quartet II keeps for the
  backward pass."""
  key = None if spec.rounding == "nearest" else rounding_bits.content_key(v, stream)
  return qtensor.dequantize(qtensor.quantize(v, spec, key=key), jnp.float32)


def _backward_spec(cfg, gemm: str, role: str):
  return cfg.roles.grad if cfg.backward_from_forward else cfg.roles.operand(gemm, role)


def _from_forward(cfg, role: str) -> bool:
  return cfg.backward_from_forward or role in cfg.from_forward


def _quantize(v, spec, stream):
  key = None if spec.rounding == "nearest" else rounding_bits.content_key(v, stream)
  return qtensor.quantize(v, spec, key=key)


def wgrad_operands(x: jax.Array, dy: jax.Array, cfg):
  """Wgrad's quantized operands ``(X^T, dY^T)`` [..., K|N, T_pad] from the rows ``x``
  [..., T, K] and ``dy`` [..., T, N], both rotated along the tokens T."""
  if _from_forward(cfg, "input"):
    x = forward_values(x, cfg.roles.input, 1)
  xt, dyt = pair(_swap(x), _swap(dy.astype(jnp.float32)), cfg, dy)
  return (_quantize(xt, _backward_spec(cfg, "wgrad", "input"), 6),
          _quantize(dyt, cfg.roles.operand("wgrad", "grad"), 5))


def dgrad_operands(dy: jax.Array, w_t: jax.Array, cfg, per_expert: bool = False):
  """Dgrad's quantized operands ``(dY, W^T)`` [..., M|K, N_pad] from ``dy`` [..., M, N] and
  ``w_t`` [..., K, N], rotated along N; ``per_expert``: ``w_t`` is [E, K, F], each expert's
  weight a tensor of its own (one tensor scale each, as the grouped GEMM's Fprop). With
  ``backward_from_forward`` or ``from_forward`` naming the weight, W is first quantized
  as the forward pass did."""
  each = jax.vmap if per_expert else (lambda f: f)
  if _from_forward(cfg, "weight"):
    w_t = _swap(each(lambda m: forward_values(m, cfg.roles.weight, 2))(_swap(w_t)))
  dyr, wr = pair(dy.astype(jnp.float32), w_t, cfg, dy)
  spec = _backward_spec(cfg, "dgrad", "weight")
  return _quantize(dyr, cfg.roles.grad, 4), each(lambda m: _quantize(m, spec, 3))(wr)


def fprop_operands(x: jax.Array, w_t: jax.Array, cfg):
  """Fprop's rotated high-precision operands ``(X, W^T)``, ``x`` [..., M, K] and ``w_t``
  [..., N, K] rotated along K with one draw of signs (from X)."""
  return pair(x, w_t, cfg, x)


def grouped_fprop_operands(x: jax.Array, w: jax.Array, cfg):
  """The grouped GEMM's Fprop operands: rows ``x`` [N, K] and weights ``w`` [E, K, F], both
  rotated along K where ``cfg`` rotates Fprop (one draw of signs, from X), else as given."""
  if not on(cfg, "fprop"):
    return x, w
  xr, wr_t = pair(x, _swap(w), cfg, x)
  return xr, _swap(wr_t)


__all__ = ["RHT_GEMMS", "dgrad_operands", "forward_values", "fprop_operands",
           "grouped_fprop_operands", "on", "pair", "rotate", "signs", "wgrad_operands"]
