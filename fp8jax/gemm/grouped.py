"""A simulated FP8 grouped GEMM for MoE experts (rows sorted by expert).

``fp8_ragged_dot(x, w, group_sizes, config)`` computes ``y[n] = x[n] @ w[g(n)]`` for rows
``x`` [N, K] grouped by expert and stacked weights ``w`` [E, K, F], with the roles and
transpose policy of a :class:`fp8jax.GemmConfig`:

* Fprop ``Y = Q_in(X) . Q_w(W_e)`` (X in 1x128 tiles along K, W_e^T [F, K] in blocks);
* Dgrad ``dX = Q_grad(dY) . Q_w(W_e)^T``;
* Wgrad ``dW_e = Q_in(X_e)^T . Q_grad(dY_e)`` with X^T and dY^T tiled along each expert's
  rows: every group is zero-padded to whole scale tiles along the tokens (and Hadamard
  blocks, and promotion intervals with the tensor-core model) before X^T and dY^T are
  quantized, so that no tile spans two experts, as when each expert's GEMM runs on its own
  rows.

With FP32 accumulation the products run through :func:`padded_grouped_matmul` on the dequantized
operands in float32 (``lax.ragged_dot``'s dense rewrite runs out of memory at 2B shapes), or
through the grouped blockwise-scaled kernel (:mod:`fp8jax.kernels.grouped_scaled_pallas`)
where the scales are float32 tiles of 1 x 128 and 128 x 128 (DeepSeek-V3): ``config.impl``
"auto" takes it on one GPU, "xla" never, "pallas" wherever the scales suit it (interpreted
off GPU). The two differ by float32 rounding (per-element against per-interval scaling).
On the kernels in the padded layout, X and dY are each quantized for both of their GEMMs in
one read (:mod:`fp8jax.gemm.grouped_operands`).

With the tensor-core accumulation model the three GEMMs run through
:mod:`fp8jax.gemm.grouped_tensor_core` (always XLA): every expert's rows of Y and dX and
every dW_e equal the dense simulation (``fp8_dot_general``) of that expert's GEMM bit for bit,
wherever the rows' scales are the same (not the per-tensor levels all experts share).

Each expert's weight is a tensor of its own (its own per-tensor level with two-level NVFP4
scales); X and dY share one per-tensor level over all experts."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.gemm import dense as gemm_lib
from fp8jax.gemm import grouped_operands, grouped_tensor_core, operands, padding, rotation
from fp8jax.gemm.grouped_padded import padded_grouped_matmul  # noqa: F401  (also this module's API)
from fp8jax.kernels import grouped_gpu, grouped_scaled_pallas
from fp8jax.numerics import arguments
from fp8jax.quant import qtensor


def _deq(qt):
  return qtensor.dequantize(qt, jnp.float32)


def _rdot(a, b, sizes, mode):
  """[N, K] x [E, K, F] grouped product in float32 (bf16 operands in "bf16" mode)."""
  if mode == "bf16":
    a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  with jax.default_matmul_precision("highest"):
    return padded_grouped_matmul(a, b, sizes, out_dtype=jnp.float32)


def _wgrad_product(a, b, sizes):
  """dW [E, K, F] = per group a_g^T b_g, for a [N, K], b [N, F] (float32)."""
  zeros = jnp.zeros((sizes.shape[0], a.shape[1], b.shape[1]), a.dtype)
  with jax.default_matmul_precision("highest"):
    _, vjp = jax.vjp(lambda w: padded_grouped_matmul(a, w, sizes, out_dtype=jnp.float32), zeros)
    return vjp(b.astype(jnp.float32))[0].astype(jnp.float32)


def _check(cfg: gemm_lib.GemmConfig):
  if native := [d for d in ("fprop", "dgrad", "wgrad") if getattr(cfg, d) == "fp8_native"]:
    raise ValueError(f"{native[0]}=fp8_native is not available for the grouped GEMM")


def _tensor_core(cfg: gemm_lib.GemmConfig) -> bool:
  return cfg.accumulation.mode == "tensor_core"


def _kernel_interval(cfg: gemm_lib.GemmConfig, a, b) -> int:
  """The promotion interval when the FP32-accumulation product of the quantized rows ``a``
  ([N, K] or [K, N] for Wgrad) and ``b`` may run in the grouped blockwise-scaled kernel
  (:mod:`fp8jax.kernels.grouped_scaled_pallas`), else 0: ``cfg.impl`` "pallas", or "auto"
  on one GPU; FP32 accumulation, one-level float32 scales in 1 x I tiles along the
  contraction for ``a`` and ``[c, I]`` blocks (c = 1 or I) for ``b``."""
  if not grouped_operands.kernels_on(cfg):
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


def _interpret() -> bool:
  """Whether the kernels run in the Pallas interpreter: off GPU (``impl="pallas"``)."""
  return jax.default_backend() != "gpu"


def _kernel_rows(aq, bq, sizes, interval, out_dtype, layout: int, cfg,
                 transpose_b: bool = True):
  """Fprop / Dgrad in the kernel: rows [N, K] x contraction-last weights [E, F, K] (or
  [E, K, F] without ``transpose_b``), the float32 accumulator rounded once to ``out_dtype``
  as it is stored; groups laid out at ``layout`` rows (whole row tiles where it is a
  multiple of the tile's); with ``cfg.fp8_mma`` the products on the FP8 tensor cores where
  both payloads share a format."""
  gsp = grouped_scaled_pallas
  fp8 = cfg.fp8_mma and gsp.smp.fp8_dots_apply(aq.data.dtype, bq.data.dtype, interval)
  blocks = gsp.ROWS_FP8 if fp8 else gsp.ROWS
  return gsp.grouped_scaled_matmul(
      aq.data, aq.scale_inv, bq.data, bq.scale_inv, sizes, transpose_b=transpose_b,
      interval=interval, b_block_n=bq.block[-2 if transpose_b else -1],
      out_dtype=out_dtype, blocks=blocks,
      groups_aligned=layout % blocks.m == 0, convert_in_kernel=True, fp8_dots=fp8,
      interpret=_interpret())


def _weight_q(w_t, spec):
  """Each expert's weight [E, F, K] quantized on its own (one tensor scale each)."""
  return jax.vmap(lambda m: qtensor.quantize(m, spec, key=gemm_lib.operand_key(m, spec, 2)))(
      w_t)


def _dgrad_weight_q(w_e, cfg):
  """One expert's weight [K, F] quantized for Dgrad (contraction over F): W^T's copy
  (``operands.second_copy``) of the Fprop operand W_e^T [F, K]."""
  spec, w_t = cfg.roles.weight, w_e.T
  return operands.second_copy(w_t, qtensor.quantize(w_t, spec, key=gemm_lib.operand_key(
      w_t, spec, 2)), cfg, "weight", w_e, 3)  # [K, F]


def _buffers(*arrays):
  """The arrays behind ``lax.optimization_barrier``, buffers of their own: fused into each
  quantization, the dispatch's gather ran in its transposed consumers' layout (151 GB/s)."""
  out = lax.optimization_barrier(arrays)
  return out[0] if len(arrays) == 1 else out


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _grouped(x, w, sizes, w_once, cfg, layout):
  return _fprop(_buffers(x), w, _layout_sizes(sizes, layout), cfg, layout, None,
                _once(w, w_once, cfg)).astype(x.dtype)


def _once(w, w_once, cfg):
  """The once-quantized weights: the caller's, else quantized here (or None)."""
  return grouped_operands.weight_quantized_once(w, cfg) if w_once is None else w_once


def _layout_sizes(sizes, layout: int):
  """The group sizes in the rows' layout: each rounded up to ``layout`` rows."""
  return sizes if layout == 1 else padding.padded_sizes(sizes, layout)


def _fprop(x, w, sizes, cfg, layout, xq=None, w_once=None):
  """Y [N, F]; ``w_once``: the weights quantized in their own layout
  (``grouped_operands.weight_quantized_once``), read transposed by the kernel (or swapped:
  the same bits as quantizing W^T)."""
  if cfg.fprop == "bf16":
    return _rdot(x, w, sizes, "bf16")
  x, w = rotation.grouped_fprop_operands(x, w, cfg)  # rotated along K where cfg says
  if xq is None:
    xq = qtensor.quantize(x, cfg.roles.input, key=gemm_lib.operand_key(x, cfg.roles.input, 1))
  if w_once is not None:
    wq = _swap_blocks(dataclasses.replace(w_once, data=jnp.swapaxes(w_once.data, -1, -2),
                                          scale_inv=jnp.swapaxes(w_once.scale_inv, -1, -2)))
    if interval := _kernel_interval(cfg, xq, wq):
      fp8 = cfg.fp8_mma and grouped_scaled_pallas.smp.fp8_dots_apply(
          xq.data.dtype, wq.data.dtype, interval)
      if grouped_operands.fprop_reads_transposed(fp8):
        return _kernel_rows(xq, w_once, sizes, interval, x.dtype, layout, cfg,
                            transpose_b=False)
      return _kernel_rows(xq, wq, sizes, interval, x.dtype, layout, cfg)
  else:
    wq = _weight_q(jnp.swapaxes(w, -1, -2), cfg.roles.weight)  # [E, F, K]
  if _tensor_core(cfg):
    return grouped_tensor_core.rows_product(xq, wq, sizes, cfg.accumulation)
  if interval := _kernel_interval(cfg, xq, wq):
    return _kernel_rows(xq, wq, sizes, interval, x.dtype, layout, cfg)
  return _rdot(_deq(xq), jnp.swapaxes(jax.vmap(_deq)(wq), -1, -2), sizes, "fp8")


def _fwd(x, w, sizes, w_once, cfg, layout):
  x = _buffers(x)
  w_once = _once(w, w_once, cfg)
  w_res = w if w_once is None else w_once  # the 8-bit weight, for Dgrad
  if grouped_operands.one_pass(cfg, layout, *x.shape, w.shape[-1]):
    xq, xtq = grouped_operands.both_ways(x, cfg.roles.input)
    y = _fprop(x, w, _layout_sizes(sizes, layout), cfg, layout, xq, w_once)
    return y.astype(x.dtype), (xtq, w_res, sizes)
  y = _fprop(x, w, _layout_sizes(sizes, layout), cfg, layout, None, w_once)
  return y.astype(x.dtype), (x, w_res, sizes)


def _swap_blocks(q: qtensor.QTensor) -> qtensor.QTensor:
  """``q`` described as its transpose for :func:`_kernel_interval` (block axes swapped)."""
  return dataclasses.replace(q, block=(*q.block[:-2], q.block[-1], q.block[-2]))


def _wgrad_fp32(x, dy, sizes, cfg, layout):
  """dW [E, K, F] with FP32 accumulation, on groups padded to whole token tiles and Hadamard
  blocks (:func:`_wgrad_operands`); transposed where the kernel multiplies FP8 payloads."""
  rows_first = grouped_operands.rows_first(cfg) and not grouped_operands.fp8_wgrad(cfg)
  a, b, sizes = _wgrad_operands(x, dy, sizes, cfg, layout, rows_first)
  return _wgrad_quantized(a, b, sizes, cfg, layout, rows_first)


def _wgrad_quantized(a, b, sizes, cfg, layout, rows_first: bool = False):
  """dW [E, K, F] from the quantized X^T [K, N] and dY^T [F, N] (``rows_first``: X [N, K]
  and dY [N, F]): the blockwise-scaled kernel where it applies (FP8 dots with
  ``fp8_mma``), else the product of the dequantized operands."""
  at, bt = (_swap_blocks(a), _swap_blocks(b)) if rows_first else (a, b)
  interval = _kernel_interval(cfg, at, bt)
  if interval and bt.block[-2] == 1 and max(group_multiple_of(cfg), layout) % interval == 0:
    return grouped_scaled_pallas.grouped_scaled_wgrad(
        a.data, a.scale_inv, b.data, b.scale_inv, sizes, interval=interval,
        groups_aligned=True, rows_first=rows_first, convert_in_kernel=True,
        fp8_dots=cfg.fp8_mma and grouped_scaled_pallas.smp.fp8_dots_apply(
            a.data.dtype, b.data.dtype, interval), interpret=_interpret())
  if rows_first:
    return _wgrad_product(_deq(a), _deq(b), sizes)
  return _wgrad_product(jnp.swapaxes(_deq(a), 0, 1), jnp.swapaxes(_deq(b), 0, 1), sizes)


def _token_block(spec) -> int:
  """The scale block along the tokens of a Wgrad operand [C, tokens]; 0 when one scale
  spans all tokens."""
  probe = 2**40
  g = spec.granularity.block_shape((1, probe))[-1]
  return 0 if g == probe else g


def group_multiple_of(config: gemm_lib.GemmConfig) -> int:
  """The row multiple that ``config``'s grouped Wgrad pads each group to (1: none): whole
  scale tiles along the tokens of X^T and dY^T, Hadamard blocks and, with the tensor-core
  model, promotion intervals. A dispatch that lays its sorted rows out with every group
  padded to it (and passes it as ``fp8_ragged_dot``'s ``group_multiple``) spares the GEMM
  the padding copies."""
  if config.wgrad == "bf16":
    return 1
  acc = config.accumulation
  multiple = (acc.promotion_interval or acc.block_size) if _tensor_core(config) else 1
  for g in (_token_block(config.roles.operand("wgrad", "input")),
            _token_block(config.roles.operand("wgrad", "grad")),
            config.wgrad_hadamard):
    multiple = math.lcm(multiple, g or 1)
  return multiple


def _wgrad_operands(x, dy, sizes, cfg, layout, rows_first: bool = False):
  """X^T [K, N_pad] and dY^T [F, N_pad] quantized for Wgrad, each group zero-padded to a
  multiple of :func:`group_multiple_of` rows first, so that no scale tile, Hadamard block
  or promotion interval spans two experts (as when each expert's GEMM runs on its own rows).

  Args:
    x: [N, K] and dy: [N, F], rows sorted by group, each group padded to ``layout`` rows.
    sizes: int32 [E] (unpadded).
    cfg: the GEMM config (roles, transpose policy, Hadamard transform, accumulation).
    layout: the row multiple of the rows as given: 1, or a multiple of the padding's.
    rows_first: return the same quantization untransposed, X [N_pad, K] and dY [N_pad, F]
      (``grouped_operands.rows_first`` configs only).

  Returns:
    ``(xt, dyt, sizes_pad [E])``, two QTensors and the group sizes in their layout.
  """
  r, multiple = cfg.roles, group_multiple_of(cfg)
  valid = None
  if max(layout, multiple) > 1 and cfg.transpose == "scaling_aware" and not cfg.wgrad_hadamard:
    n_pad = x.shape[0] if layout > 1 else padding.padded_count(x.shape[0], sizes.shape[0],
                                                               multiple)
    # materialized: fused into the quantization, XLA would search the groups per element
    valid = lax.optimization_barrier(padding.padded_rows(
        sizes, x.shape[0], n_pad, max(layout, multiple))[1])
  if layout > 1:  # already padded (with zero rows)
    sizes = padding.padded_sizes(sizes, layout)
  elif multiple > 1:
    x, _ = padding.pad_groups(x, sizes, multiple)
    dy, sizes = padding.pad_groups(dy, sizes, multiple)
  dy = dy.astype(jnp.float32)  # after the padding, which moves dY in its own dtype
  if rows_first:
    return operands.second_copy_columns(x, cfg, "input"), operands.second_copy_columns(
        dy, cfg, "grad"), sizes
  if cfg.wgrad_hadamard:  # X^T [K, rows] and dY^T [F, rows] rotated along the rows
    return (*rotation.wgrad_operands(x, dy, cfg), sizes)
  mask = (lambda q: q) if valid is None else (lambda q: padding.mask_padding_scales(q, valid))
  xt = operands.second_copy(x, mask(qtensor.quantize(x, r.input)), cfg, "input", x, 6)
  dyt = operands.second_copy(dy, mask(qtensor.quantize(dy, r.grad)), cfg, "grad", dy, 5)
  return xt, dyt, sizes


def _wgrad_tensor_core(x, dy, sizes, cfg, layout):
  """dW [E, K, F] with the tensor-core model: each group zero-padded to whole promotion
  intervals, scale tiles along the tokens and Hadamard blocks, then quantized."""
  xtq, dytq, padded = _wgrad_operands(x, dy, sizes, cfg, layout)
  return grouped_tensor_core.wgrad_product(xtq, dytq, padded, cfg.accumulation)


def _dgrad(dyq, w, sizes, cfg, layout, dtype):
  """dX [N, K] from the quantized dY [N, F] and each expert's weight quantized for Dgrad
  (``w`` as quantized by ``grouped_operands.weight_quantized_once``, or [E, K, F])."""
  if isinstance(w, qtensor.QTensor):
    wq = w
  else:
    wq = jax.vmap(lambda w_e: _dgrad_weight_q(w_e, cfg))(w)  # [E, K, F]
  if _tensor_core(cfg):
    return grouped_tensor_core.rows_product(dyq, wq, sizes, cfg.accumulation)
  if interval := _kernel_interval(cfg, dyq, wq):
    return _kernel_rows(dyq, wq, sizes, interval, dtype, layout, cfg)
  return _rdot(_deq(dyq), jnp.swapaxes(jax.vmap(_deq)(wq), -1, -2), sizes, "fp8")


def _bwd(cfg, layout, res, dy):
  x, w, real_sizes = res
  sizes = _layout_sizes(real_sizes, layout)
  if isinstance(x, qtensor.QTensor):  # one_pass: x is X^T as quantized for Wgrad
    dyq, dytq = grouped_operands.both_ways(_buffers(dy), cfg.roles.grad)
    dx = _dgrad(dyq, w, sizes, cfg, layout, x.dtype)
    return dx.astype(x.dtype), _wgrad_quantized(x, dytq, sizes, cfg, layout).astype(
        w.dtype), None, None
  x, dy = _buffers(x, dy)
  dy_out, dy = dy, dy.astype(jnp.float32)  # dY in the output's dtype, and in float32
  if cfg.dgrad == "bf16":
    dx = _rdot(dy, jnp.swapaxes(w, -1, -2), sizes, "bf16")
  else:
    dx = _dgrad(*(rotation.dgrad_operands(dy, w, cfg, True) if rotation.on(cfg, "dgrad") else (
        qtensor.quantize(dy, cfg.roles.grad, key=gemm_lib.operand_key(dy, cfg.roles.grad, 4)),
        w)), sizes, cfg, layout, x.dtype)
  if cfg.wgrad == "bf16":
    dw = _wgrad_product(x.astype(jnp.bfloat16), dy.astype(jnp.bfloat16), sizes)
  elif _tensor_core(cfg):
    dw = _wgrad_tensor_core(x, dy_out, real_sizes, cfg, layout)
  else:
    dw = _wgrad_fp32(x, dy_out, real_sizes, cfg, layout)
  return dx.astype(x.dtype), dw.astype(w.dtype), None, None


_grouped.defvjp(_fwd, _bwd)


def fp8_ragged_dot(x: jax.Array, w: jax.Array, group_sizes: jax.Array,
                   config: gemm_lib.GemmConfig = gemm_lib.FP32_BLOCKWISE,
                   group_multiple: int = 1, w_once: qtensor.QTensor | None = None
                   ) -> jax.Array:
  """Grouped GEMM with simulated FP8 operands.

  Args:
    x: [N, K] rows sorted by group. With ``group_multiple`` m > 1, each group's rows start
      on a multiple of m and zero rows fill it up to the next one (the layout of
      :func:`fp8jax.gemm.padding.pad_groups`; a dispatch can gather into it directly).
    w: [E, K, F] one weight per group.
    group_sizes: int32 [E] real rows per group (unpadded), in the layout summing to at
      most N.
    config: roles, per-direction precision, transpose policy and accumulation (FP32 or
      the tensor-core model).
    group_multiple: the rows' layout; 1 or a multiple of :func:`group_multiple_of` (config),
      so that Wgrad needs no padding copies of its own.
    w_once: ``w`` as quantized by ``grouped_operands.weights_once`` (configs where
      ``grouped_operands.weight_once`` holds), when the caller has it; None: quantized here.

  Returns:
    [N, F] in x's dtype (zeros on padding rows).
  """
  config = gemm_lib.check_config(config, "fp8_ragged_dot")
  _check(config)
  for name, value, rank in (("x", x, 2), ("w", w, 3), ("group_sizes", group_sizes, 1)):
    if arguments.array(value, name, "fp8_ragged_dot").ndim != rank:
      raise ValueError(f"fp8_ragged_dot: {name} must have rank {rank}, got shape "
                       f"{tuple(value.shape)}")
  need = group_multiple_of(config)
  if group_multiple < 1 or (group_multiple > 1 and group_multiple % need):
    raise ValueError(f"group_multiple={group_multiple} must be 1 or a multiple of the "
                     f"{need} rows each group is padded to for this config's Wgrad")
  if w_once is not None and (not grouped_operands.weight_once(config)
                             or tuple(w_once.shape) != tuple(w.shape)):
    raise ValueError(f"fp8_ragged_dot: w_once must quantize w {tuple(w.shape)} once "
                     f"(grouped_operands.weight_once), got {tuple(w_once.shape)} for "
                     f"{config.describe()}")
  return _grouped(x, w, group_sizes.astype(jnp.int32), w_once, config, group_multiple)


def matmul_for(impl: str, config: gemm_lib.GemmConfig | None):
  """The MoE experts' grouped GEMM ``(x [N, d], w [E, d, f], group_sizes [E]) -> [N, f]``
  and the row multiple its groups are laid out at: the FP8 GEMM simulation
  (:func:`fp8_ragged_dot`) with ``config`` when there is one (groups padded to
  :func:`group_multiple_of`), else XLA's tiled GEMM (``impl="dispatch"``,
  :func:`padded_grouped_matmul`) or the Pallas kernels (``impl="pallas"``, GPU: per direction the
  faster of JAX's Mosaic GPU kernels and the Triton ones, see
  :mod:`fp8jax.kernels.grouped_gpu`), on unpadded groups."""
  if config is not None:
    multiple = group_multiple_of(config)
    return functools.partial(fp8_ragged_dot, config=config, group_multiple=multiple), multiple
  if impl == "pallas":  # the dispatch routes every row: the sizes sum to N
    return functools.partial(grouped_gpu.grouped_matmul, covered=True), 1
  return padded_grouped_matmul, 1
