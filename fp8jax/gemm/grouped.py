"""A simulated FP8 grouped GEMM for MoE experts (rows sorted by expert).

``fp8_ragged_dot(x, w, group_sizes, config)`` computes ``y[n] = x[n] @ w[g(n)]`` for rows
``x`` [N, K] grouped by expert and stacked weights ``w`` [E, K, F], with the roles and
transpose policy of a :class:`fp8jax.GemmConfig`:

* Fprop ``Y = Q_in(X) . Q_w(W_e)`` (X in 1x128 tiles along K, W_e^T [F, K] in blocks);
* Dgrad ``dX = Q_grad(dY) . Q_w(W_e)^T``;
* Wgrad ``dW_e = Q_in(X_e)^T . Q_grad(dY_e)`` with X^T and dY^T tiled along the sorted rows.

With FP32 accumulation the products run through :func:`tiled_matmul` (static shapes;
``lax.ragged_dot`` falls back to a dense rewrite that runs out of memory at 2B shapes on the
GPU image) on the dequantized operands in float32 (per-element instead of per-interval
scaling, which differs only by float32 rounding); Wgrad tiles along the rows may then span
two experts' groups (kernels that pad each group to a multiple of 128 would not); with group
sizes that are multiples of the tile they coincide.

With the tensor-core accumulation model (``config.accumulation.mode == "tensor_core"``) the
three GEMMs run through :mod:`fp8jax.gemm.grouped_tc` instead: every expert's rows of Y and
dX and every dW_e equal the dense simulation (``fp8_dot_general``) of that expert's GEMM bit
for bit, wherever the rows' scales are the same (tiles and blocks, not the per-tensor levels
that all experts share, see below). For Wgrad each group is zero-padded to whole promotion
intervals and scale tiles along the tokens before X^T and dY^T are quantized, so that no
tile or interval spans two experts. This is always the XLA simulation: the Pallas grouped
kernels (``fp8jax.kernels.grouped_gpu``, used by ``moe_impl="pallas"`` without a GEMM
policy) multiply BF16 operands with the tensor cores' own FP32 accumulation and never stand
in for a simulated FP8 GEMM.

Each expert's weight is quantized as a tensor of its own (its own per-tensor level with
two-level NVFP4 scales); the rows X and dY share one per-tensor level over all experts.
With ``config.wgrad_hadamard`` the groups are zero-padded to whole transform blocks
(:func:`pad_groups`) so that the Hadamard transform never mixes two experts' rows.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from fp8jax.gemm import dense as gemm_lib
from fp8jax.gemm import grouped_tc, hadamard, transpose
from fp8jax.kernels import grouped_scaled_pallas, placement
from fp8jax.quant import qtensor

KERNEL_INTERPRET = False
"""Tests set it to run the blockwise-scaled kernel path in the Pallas interpreter on CPU."""


def tiled_matmul(x, w, group_sizes, tile: int = 128, out_dtype=None):
  """Grouped GEMM with static shapes: each group is padded to whole tiles of ``tile``
  rows, every tile takes its group's weight, and one batched matmul runs over the tiles.

  Rows: at most ``N + E * (tile - 1)`` after padding (a static bound), so the work is at
  most that over N times the ideal, and nothing is dropped.

  Args:
    x: [N, d] rows sorted by group.
    w: [E, d, f].
    group_sizes: int32 [E] summing to at most N; rows past the sum give zeros.

  Returns:
    [N, f] in ``out_dtype`` (default x's dtype).
  """
  n, d = x.shape
  e = w.shape[0]
  n_tiles = -(-(n + e * (tile - 1)) // tile)
  padded = (group_sizes + tile - 1) // tile * tile
  pad_start = jnp.cumsum(padded) - padded
  start = jnp.cumsum(group_sizes) - group_sizes
  group = jnp.repeat(jnp.arange(e), group_sizes, total_repeat_length=n)
  dest = pad_start[group] + jnp.arange(n) - start[group]
  valid = (jnp.arange(n) < jnp.sum(group_sizes))[:, None]
  x_pad = jnp.zeros((n_tiles * tile, d), x.dtype).at[dest].set(jnp.where(valid, x, 0))
  tile_group = jnp.searchsorted(jnp.cumsum(padded), jnp.arange(n_tiles) * tile, side="right")
  w_tiles = jnp.take(w, jnp.minimum(tile_group, e - 1), axis=0)
  y = jnp.einsum("tmd,tdf->tmf", x_pad.reshape(n_tiles, tile, d), w_tiles,
                 preferred_element_type=jnp.float32)
  y = jnp.where(valid, y.reshape(n_tiles * tile, -1)[dest], 0)
  return y.astype(out_dtype or x.dtype)


def _deq(qt):
  return qtensor.dequantize(qt, jnp.float32)


def _rdot(a, b, sizes, mode):
  """[N, K] x [E, K, F] grouped product in float32 (bf16 operands in "bf16" mode)."""
  if mode == "bf16":
    a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  with jax.default_matmul_precision("highest"):
    return tiled_matmul(a, b, sizes, out_dtype=jnp.float32)


def _wgrad_product(a, b, sizes):
  """dW [E, K, F] = per group a_g^T b_g, for a [N, K], b [N, F] (float32)."""
  zeros = jnp.zeros((sizes.shape[0], a.shape[1], b.shape[1]), a.dtype)
  with jax.default_matmul_precision("highest"):
    _, vjp = jax.vjp(lambda w: tiled_matmul(a, w, sizes, out_dtype=jnp.float32), zeros)
    return vjp(b.astype(jnp.float32))[0].astype(jnp.float32)


def _check(cfg: gemm_lib.GemmConfig):
  for direction in ("fprop", "dgrad", "wgrad"):
    if getattr(cfg, direction) == "fp8_native":
      raise ValueError(f"{direction}=fp8_native is not available for the grouped GEMM")


def _tensor_core(cfg: gemm_lib.GemmConfig) -> bool:
  return cfg.accumulation.mode == "tensor_core"


def _kernel_interval(cfg: gemm_lib.GemmConfig, a, b) -> int:
  """The promotion interval when the FP32-accumulation product of the quantized rows ``a``
  ([N, K] or [K, N] for Wgrad) and ``b`` may run in the grouped blockwise-scaled kernel
  (:mod:`fp8jax.kernels.grouped_scaled_pallas`), else 0: one GPU (or the interpreter,
  :data:`KERNEL_INTERPRET`), FP32 accumulation, one-level float32 scales in 1 x I tiles
  along the contraction for ``a`` and ``[c, I]`` blocks (c = 1 or I) for ``b``."""
  if _tensor_core(cfg) or not (KERNEL_INTERPRET or placement.kernels_allowed()):
    return 0
  ok = all(q.tensor_scale_inv is None and q.scale_inv.dtype == jnp.float32
           and grouped_scaled_pallas.smp.supports_payload(q.data.dtype) for q in (a, b))
  interval = a.block[-1]
  if not ok or tuple(a.block[-2:]) != (1, interval) or b.block[-1] != interval:
    return 0
  if b.block[-2] not in (1, interval) or not grouped_scaled_pallas.smp.supports_interval(
      interval):
    return 0
  return interval


def _kernel_rows(aq, bq, sizes, interval):
  """Fprop / Dgrad in the kernel: rows [N, K] x contraction-last weights [E, F, K]."""
  return grouped_scaled_pallas.grouped_scaled_matmul(
      aq.data, aq.scale_inv, bq.data, bq.scale_inv, sizes, transpose_b=True,
      interval=interval, b_block_n=bq.block[-2], convert_in_kernel=True,
      interpret=KERNEL_INTERPRET)


def pad_groups(x: jax.Array, sizes: jax.Array, multiple: int):
  """Rows sorted by group, each group zero-padded to a multiple of ``multiple`` rows.

  Args:
    x: [N, C] rows sorted by group (rows past ``sum(sizes)`` are dropped).
    sizes: int32 [E].
    multiple: the row multiple.

  Returns:
    ``(x_pad [N + E * (multiple - 1) rounded up to the multiple, C], padded_sizes [E])``.
  """
  dest, padded, n_pad = grouped_tc.group_layout(sizes, x.shape[0], multiple)
  out = jnp.zeros((n_pad, x.shape[1]), x.dtype).at[dest].set(x, mode="drop")
  return out, padded


def _weight_q(w_t, spec):
  """Each expert's weight [E, F, K] quantized on its own (one tensor scale each)."""
  return jax.vmap(lambda m: qtensor.quantize(m, spec, key=gemm_lib.operand_key(m, spec, 2)))(
      w_t)


def _quantized_weight(w_t, spec):
  """:func:`_weight_q`, dequantized."""
  return jax.vmap(_deq)(_weight_q(w_t, spec))


def _dgrad_weight_q(w_e, cfg):
  """One expert's weight [K, F] quantized for Dgrad (contraction over F): the transpose of
  the Fprop operand W_e^T [F, K] by ``cfg.transpose``."""
  spec = cfg.roles.weight
  w_t = w_e.T
  return transpose.transposed(w_t, qtensor.quantize(w_t, spec, key=gemm_lib.operand_key(
      w_t, spec, 2)), spec, cfg.transpose, gemm_lib.operand_key(w_e, spec, 3))  # [K, F]


def _dgrad_weight(w_e, cfg):
  """:func:`_dgrad_weight_q` dequantized and returned as [F, K]."""
  return _deq(_dgrad_weight_q(w_e, cfg)).T


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _grouped(x, w, sizes, cfg):
  return _fprop(x, w, sizes, cfg)


def _fprop(x, w, sizes, cfg):
  if cfg.fprop == "bf16":
    return _rdot(x, w, sizes, "bf16")
  xq = qtensor.quantize(x, cfg.roles.input, key=gemm_lib.operand_key(x, cfg.roles.input, 1))
  wq = _weight_q(jnp.swapaxes(w, -1, -2), cfg.roles.weight)  # [E, F, K]
  if _tensor_core(cfg):
    return grouped_tc.rows_product(xq, wq, sizes, cfg.accumulation)
  if interval := _kernel_interval(cfg, xq, wq):
    return _kernel_rows(xq, wq, sizes, interval)
  return _rdot(_deq(xq), jnp.swapaxes(jax.vmap(_deq)(wq), -1, -2), sizes, "fp8")


def _fwd(x, w, sizes, cfg):
  return _fprop(x, w, sizes, cfg), (x, w, sizes)


def _wgrad_fp32(x, dy, sizes, cfg):
  """dW [E, K, F] with FP32 accumulation: the blockwise-scaled kernel where it applies (on
  the unpadded rows: a tile of 128 tokens spanning two experts has one scale, as in the XLA
  simulation), else the product of the dequantized operands."""
  r = cfg.roles
  if cfg.wgrad_hadamard:  # transform inside each group: pad the groups to whole blocks
    n = cfg.wgrad_hadamard
    xp, padded = pad_groups(x, sizes, n)
    dyp, _ = pad_groups(dy, sizes, n)
    xt = hadamard.random_hadamard(xp.T, n, cfg.hadamard_seed)  # [K, rows]
    dyt = hadamard.random_hadamard(dyp.T, n, cfg.hadamard_seed)  # [F, rows]
    xt = _deq(qtensor.quantize(xt, r.input, key=gemm_lib.operand_key(xt, r.input, 6)))
    dyt = _deq(qtensor.quantize(dyt, r.grad, key=gemm_lib.operand_key(dyt, r.grad, 5)))
    return _wgrad_product(xt.T, dyt.T, padded)
  xt = transpose.transposed(x, qtensor.quantize(x, r.input), r.input, cfg.transpose,
                            gemm_lib.operand_key(x, r.input, 6))  # [K, N]
  dyt = transpose.transposed(dy, qtensor.quantize(dy, r.grad), r.grad, cfg.transpose,
                             gemm_lib.operand_key(dy, r.grad, 5))  # [F, N]
  interval = _kernel_interval(cfg, xt, dyt)
  if interval and dyt.block[-2] == 1:
    return grouped_scaled_pallas.grouped_scaled_wgrad(
        xt.data, xt.scale_inv, dyt.data, dyt.scale_inv, sizes, interval=interval,
        groups_aligned=False, convert_in_kernel=True, interpret=KERNEL_INTERPRET)
  return _wgrad_product(jnp.swapaxes(_deq(xt), 0, 1), jnp.swapaxes(_deq(dyt), 0, 1), sizes)


def _token_block(spec) -> int:
  """The scale block along the tokens of a Wgrad operand [C, tokens]; 0 when one scale
  spans all tokens."""
  probe = 2**40
  g = spec.granularity.block_shape((1, probe))[-1]
  return 0 if g == probe else g


def _mask_padding_scales(qt, valid):
  """``qt`` [N_pad, C] with the scale_inv of blocks holding padding rows only set to the
  smallest normal float32, which no real scale_inv is below: a scaling-aware transpose
  then takes each new block's scale from its real rows, as on the unpadded group."""
  rb = qt.full_block[-2]
  real = jax.ops.segment_max(valid.astype(jnp.int32), jnp.arange(valid.shape[0]) // rb,
                             num_segments=qt.scale_inv.shape[-2]) > 0
  scale_inv = jnp.where(real[:, None], qt.scale_inv.astype(jnp.float32),
                        jnp.finfo(jnp.float32).tiny)
  return dataclasses.replace(qt, scale_inv=scale_inv)


def _wgrad_tensor_core(x, dy, sizes, cfg):
  """dW [E, K, F] with the tensor-core model: each group zero-padded to whole promotion
  intervals, scale tiles along the tokens and Hadamard blocks, then quantized."""
  r, acc = cfg.roles, cfg.accumulation
  multiple = acc.promotion_interval or acc.block_size
  for g in (_token_block(r.input), _token_block(r.grad), cfg.wgrad_hadamard):
    multiple = math.lcm(multiple, g or 1)
  xp, padded = pad_groups(x, sizes, multiple)
  dyp, _ = pad_groups(dy, sizes, multiple)
  if cfg.wgrad_hadamard:
    xt = hadamard.random_hadamard(xp.T, cfg.wgrad_hadamard, cfg.hadamard_seed)  # [K, rows]
    dyt = hadamard.random_hadamard(dyp.T, cfg.wgrad_hadamard, cfg.hadamard_seed)
    xtq = qtensor.quantize(xt, r.input, key=gemm_lib.operand_key(xt, r.input, 6))
    dytq = qtensor.quantize(dyt, r.grad, key=gemm_lib.operand_key(dyt, r.grad, 5))
  else:
    valid = pad_groups(jnp.ones((x.shape[0], 1), bool), sizes, multiple)[0][:, 0]
    mask = (lambda q: _mask_padding_scales(q, valid)) if cfg.transpose == "scaling_aware" \
        else (lambda q: q)
    xtq = transpose.transposed(xp, mask(qtensor.quantize(xp, r.input)), r.input,
                               cfg.transpose, gemm_lib.operand_key(xp, r.input, 6))
    dytq = transpose.transposed(dyp, mask(qtensor.quantize(dyp, r.grad)), r.grad,
                                cfg.transpose, gemm_lib.operand_key(dyp, r.grad, 5))
  return grouped_tc.wgrad_product(xtq, dytq, padded, acc)


def _bwd(cfg, res, dy):
  x, w, sizes = res
  dy = dy.astype(jnp.float32)
  r = cfg.roles
  if cfg.dgrad == "bf16":
    dx = _rdot(dy, jnp.swapaxes(w, -1, -2), sizes, "bf16")
  else:
    wq = jax.vmap(lambda w_e: _dgrad_weight_q(w_e, cfg))(w)  # [E, K, F]
    dyq = qtensor.quantize(dy, r.grad, key=gemm_lib.operand_key(dy, r.grad, 4))
    if _tensor_core(cfg):
      dx = grouped_tc.rows_product(dyq, wq, sizes, cfg.accumulation)
    elif interval := _kernel_interval(cfg, dyq, wq):
      dx = _kernel_rows(dyq, wq, sizes, interval)
    else:
      dx = _rdot(_deq(dyq), jnp.swapaxes(jax.vmap(_deq)(wq), -1, -2), sizes, "fp8")
  if cfg.wgrad == "bf16":
    dw = _wgrad_product(x.astype(jnp.bfloat16), dy.astype(jnp.bfloat16), sizes)
  elif _tensor_core(cfg):
    dw = _wgrad_tensor_core(x, dy, sizes, cfg)
  else:
    dw = _wgrad_fp32(x, dy, sizes, cfg)
  return dx.astype(x.dtype), dw.astype(w.dtype), None


_grouped.defvjp(_fwd, _bwd)


def fp8_ragged_dot(x: jax.Array, w: jax.Array, group_sizes: jax.Array,
                   config: gemm_lib.GemmConfig = gemm_lib.FP32_BLOCKWISE) -> jax.Array:
  """Grouped GEMM with simulated FP8 operands.

  Args:
    x: [N, K] rows sorted by group.
    w: [E, K, F] one weight per group.
    group_sizes: int32 [E], summing to at most N.
    config: roles, per-direction precision, transpose policy and accumulation (FP32 or
      the tensor-core model).

  Returns:
    [N, F] in x's dtype.
  """
  _check(config)
  return _grouped(x, w, group_sizes.astype(jnp.int32), config).astype(x.dtype)
