"""A simulated FP8 grouped GEMM for MoE experts (rows sorted by expert).

``fp8_ragged_dot(x, w, group_sizes, config)`` computes ``y[n] = x[n] @ w[g(n)]`` for rows
``x`` [N, K] grouped by expert and stacked weights ``w`` [E, K, F], with the roles and
transpose policy of a :class:`fp8jax.GemmConfig`:

* Fprop ``Y = Q_in(X) . Q_w(W_e)`` (X in 1x128 tiles along K, W_e^T [F, K] in blocks);
* Dgrad ``dX = Q_grad(dY) . Q_w(W_e)^T``;
* Wgrad ``dW_e = Q_in(X_e)^T . Q_grad(dY_e)`` with X^T and dY^T tiled along the sorted rows.

The products run through :func:`tiled_matmul` (static shapes; ``lax.ragged_dot`` falls back
to a dense rewrite that runs out of memory at 2B shapes on the GPU image) on the
dequantized operands in float32 (FP32 accumulation; per-element instead of per-interval
scaling, which differs only by float32 rounding). Two simplifications, stated: the tensor-core
accumulation model is not available here, and Wgrad tiles along the rows may span two
experts' groups (kernels that pad each group to a multiple of 128 would not); with group
sizes that are multiples of the tile they coincide.

Each expert's weight is quantized as a tensor of its own (its own per-tensor level with
two-level NVFP4 scales); the rows X and dY share one per-tensor level over all experts.
With ``config.wgrad_hadamard`` the groups are zero-padded to whole transform blocks
(:func:`pad_groups`) so that the Hadamard transform never mixes two experts' rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fp8jax.gemm import dense as gemm_lib
from fp8jax.gemm import hadamard, transpose
from fp8jax.quant import qtensor


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
  if cfg.accumulation.mode != "fp32":
    raise ValueError("the grouped GEMM simulates FP32 accumulation only; got "
                     f"{cfg.accumulation.describe()}")


def pad_groups(x: jax.Array, sizes: jax.Array, multiple: int):
  """Rows sorted by group, each group zero-padded to a multiple of ``multiple`` rows.

  Args:
    x: [N, C] rows sorted by group (rows past ``sum(sizes)`` are dropped).
    sizes: int32 [E].
    multiple: the row multiple.

  Returns:
    ``(x_pad [N + E * (multiple - 1) rounded up to the multiple, C], padded_sizes [E])``.
  """
  n = x.shape[0]
  e = sizes.shape[0]
  n_pad = -(-(n + e * (multiple - 1)) // multiple) * multiple
  padded = (sizes + multiple - 1) // multiple * multiple
  pad_start = jnp.cumsum(padded) - padded
  start = jnp.cumsum(sizes) - sizes
  group = jnp.repeat(jnp.arange(e), sizes, total_repeat_length=n)
  dest = pad_start[group] + jnp.arange(n) - start[group]
  dest = jnp.where(jnp.arange(n) < jnp.sum(sizes), dest, n_pad)  # out of range: dropped
  out = jnp.zeros((n_pad, x.shape[1]), x.dtype).at[dest].set(x, mode="drop")
  return out, padded


def _quantized_weight(w_t, spec):
  """Each expert's weight [F, K] fake-quantized on its own (one tensor scale each)."""
  return jax.vmap(lambda m: _deq(qtensor.quantize(
      m, spec, key=gemm_lib.operand_key(m, spec, 2))))(w_t)


def _dgrad_weight(w_e, cfg):
  """One expert's weight [K, F] quantized for Dgrad (contraction over F), dequantized and
  returned as [F, K]: the transpose of the Fprop operand W_e^T [F, K] by ``cfg.transpose``."""
  spec = cfg.roles.weight
  w_t = w_e.T
  wtq = transpose.transposed(w_t, qtensor.quantize(w_t, spec, key=gemm_lib.operand_key(
      w_t, spec, 2)), spec, cfg.transpose, gemm_lib.operand_key(w_e, spec, 3))  # [K, F]
  return _deq(wtq).T


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _grouped(x, w, sizes, cfg):
  return _fprop(x, w, sizes, cfg)


def _fprop(x, w, sizes, cfg):
  if cfg.fprop == "bf16":
    return _rdot(x, w, sizes, "bf16")
  xq = qtensor.quantize(x, cfg.roles.input, key=gemm_lib.operand_key(x, cfg.roles.input, 1))
  w_hat = _quantized_weight(jnp.swapaxes(w, -1, -2), cfg.roles.weight)  # [E, F, K]
  return _rdot(_deq(xq), jnp.swapaxes(w_hat, -1, -2), sizes, "fp8")


def _fwd(x, w, sizes, cfg):
  return _fprop(x, w, sizes, cfg), (x, w, sizes)


def _wgrad_operands(x, dy, sizes, cfg):
  """The dequantized Wgrad operands ([rows, K], [rows, F]) and their group sizes."""
  r = cfg.roles
  if cfg.wgrad_hadamard:  # transform inside each group: pad the groups to whole blocks
    n = cfg.wgrad_hadamard
    xp, padded = pad_groups(x, sizes, n)
    dyp, _ = pad_groups(dy, sizes, n)
    xt = hadamard.random_hadamard(xp.T, n, cfg.hadamard_seed)  # [K, rows]
    dyt = hadamard.random_hadamard(dyp.T, n, cfg.hadamard_seed)  # [F, rows]
    xt = _deq(qtensor.quantize(xt, r.input, key=gemm_lib.operand_key(xt, r.input, 6)))
    dyt = _deq(qtensor.quantize(dyt, r.grad, key=gemm_lib.operand_key(dyt, r.grad, 5)))
    return xt.T, dyt.T, padded
  xt = transpose.transposed(x, qtensor.quantize(x, r.input), r.input, cfg.transpose,
                            gemm_lib.operand_key(x, r.input, 6))
  dyt = transpose.transposed(dy, qtensor.quantize(dy, r.grad), r.grad, cfg.transpose,
                             gemm_lib.operand_key(dy, r.grad, 5))
  return jnp.swapaxes(_deq(xt), 0, 1), jnp.swapaxes(_deq(dyt), 0, 1), sizes


def _bwd(cfg, res, dy):
  x, w, sizes = res
  dy = dy.astype(jnp.float32)
  r = cfg.roles
  if cfg.dgrad == "bf16":
    dx = _rdot(dy, jnp.swapaxes(w, -1, -2), sizes, "bf16")
  else:
    w_hat = jax.vmap(lambda w_e: _dgrad_weight(w_e, cfg))(w)  # [E, F, K]
    dyq = qtensor.quantize(dy, r.grad, key=gemm_lib.operand_key(dy, r.grad, 4))
    dx = _rdot(_deq(dyq), w_hat, sizes, "fp8")
  if cfg.wgrad == "bf16":
    a, b, wsizes = x.astype(jnp.bfloat16), dy.astype(jnp.bfloat16), sizes
  else:
    a, b, wsizes = _wgrad_operands(x, dy, sizes, cfg)
  dw = _wgrad_product(a, b, wsizes)
  return dx.astype(x.dtype), dw.astype(w.dtype), None


_grouped.defvjp(_fwd, _bwd)


def fp8_ragged_dot(x: jax.Array, w: jax.Array, group_sizes: jax.Array,
                   config: gemm_lib.GemmConfig = gemm_lib.FP32_BLOCKWISE) -> jax.Array:
  """Grouped GEMM with simulated FP8 operands.

  Args:
    x: [N, K] rows sorted by group.
    w: [E, K, F] one weight per group.
    group_sizes: int32 [E], summing to at most N.
    config: roles, per-direction precision and transpose policy (FP32 accumulation).

  Returns:
    [N, F] in x's dtype.
  """
  _check(config)
  return _grouped(x, w, group_sizes.astype(jnp.int32), config).astype(x.dtype)
