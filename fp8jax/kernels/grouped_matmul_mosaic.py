"""Grouped GEMM for the MoE experts through JAX's Mosaic GPU kernels (Hopper: wgmma + TMA).

``grouped_matmul(x, w, group_sizes)`` computes ``y[n] = x[n] @ w[g(n)]`` for rows ``x``
[N, d] sorted by group (expert) and stacked weights ``w`` [E, d, f], like
:func:`fp8jax.kernels.grouped_matmul_triton.grouped_matmul`, with a custom VJP whose three
GEMMs are the kernels that JAX ships in ``jax.experimental.pallas.ops.gpu``:

* Fprop: ``ragged_dot_mgpu.ragged_dot(x, w)``;
* Dgrad: ``ragged_dot_mgpu.ragged_dot(dy, w, transpose_rhs=True)`` (``dy @ w[g]^T``);
* Wgrad: ``transposed_ragged_dot_mgpu.transposed_ragged_dot(x, dy)`` (``x_g^T dy_g``).

They are used as shipped (no fork). What they need, checked by :func:`problem` before a
call (a shape they do not handle raises instead of returning wrong numbers):

* a Hopper GPU (sm_90), bf16 or f16 operands of one dtype (float32 accumulation, output
  in the operands' dtype);
* every contraction a multiple of ``block_k`` and every output width a multiple of
  ``block_n`` (Wgrad: ``d`` a multiple of ``block_m``; the token axis needs nothing). The
  2B model's expert width 853 is therefore stored zero-padded to 896 (``expert_pad_to``),
  not 864. (Found on an H100: a ``block_n`` that does not divide the width gives wrong
  numbers, not an error.)

The forward and Dgrad kernels never write rows past ``sum(group_sizes)``; this wrapper
sets them to zero, so the result equals the Triton kernel's. That select is a full pass
over the output (XLA does not fuse it into the consumers; a tenth of the 2B step before
the dispatch skipped it: docs/performance/archive/2026-11-23_third_pass_mosaic_cudnn.md),
so callers whose sizes always sum to N (the MoE dispatch) pass ``covered=True``.
The Mosaic kernels have no batching rule: under ``vmap`` the batch is looped over
(``groups`` per device is 1 in the trainer and the paired evaluator).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fp8jax.kernels import placement


@dataclasses.dataclass(frozen=True)
class Config:
  """Tile shape and schedule of one Mosaic GPU kernel (static, hashable)."""

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  max_concurrent_steps: int = 4
  grid_block_n: int = 2

  def kwargs(self) -> dict:
    return dataclasses.asdict(self)


# The fastest configurations of the sweeps at the 2B and 16B shapes on Hopper
# (scripts/bench/mosaic_grouped.py; docs/performance/archive/2026-11-23_third_pass_mosaic_cudnn.md).
# block_k 128 exceeds the shared memory; grid_block_n 4 is faster than 1 for Fprop and Dgrad.
FORWARD = Config(block_m=128, block_n=128, block_k=64, max_concurrent_steps=5, grid_block_n=4)
DGRAD = Config(block_m=128, block_n=128, block_k=64, max_concurrent_steps=5, grid_block_n=4)
WGRAD = Config(block_m=128, block_n=128, block_k=64, max_concurrent_steps=5, grid_block_n=2)
DTYPES = ("bfloat16", "float16")


def problem(kind: str, x_shape, w_shape, dtype, config: Config) -> str | None:
  """Why the Mosaic kernel ``kind`` ("fwd", "dgrad" or "wgrad") cannot run this shape, or
  None when it can. ``x_shape`` is [N, d] ("wgrad": x [N, d]), ``w_shape`` is the weight
  [E, d, f] for "fwd" and "dgrad" and dy [N, f] for "wgrad"."""
  if str(jnp.dtype(dtype)) not in DTYPES:
    return f"dtype {jnp.dtype(dtype)} (the kernels take {DTYPES})"
  c = config
  if kind == "wgrad":
    (_, d), (_, f) = x_shape, w_shape
    if d % c.block_m:
      return f"d={d} is not a multiple of block_m={c.block_m}"
    if f % c.block_n:
      return f"f={f} is not a multiple of block_n={c.block_n}"
    return None
  _, d, f = w_shape
  k, n = (f, d) if kind == "dgrad" else (d, f)
  if x_shape[1] != k:
    return f"x's width {x_shape[1]} is not the contraction {k}"
  if k % c.block_k:
    return f"the contraction {k} is not a multiple of block_k={c.block_k}"
  if n % c.block_n:
    return f"the output width {n} is not a multiple of block_n={c.block_n}"
  return None


def available() -> bool:
  """Whether this process runs on a Hopper GPU (the kernels use wgmma)."""
  return placement.compute_capability() == (9, 0)


def _require(kind, x_shape, w_shape, dtype, config):
  why = problem(kind, x_shape, w_shape, dtype, config)
  if why:
    raise ValueError(f"the Mosaic GPU {kind} kernel cannot take this shape: {why}")


def _unbatched(fn):
  """``fn`` with a batching rule that loops over the batch (the kernels have none)."""
  wrapped = jax.custom_batching.custom_vmap(fn)

  @wrapped.def_vmap
  def _rule(axis_size, in_batched, *args):
    args = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, b in zip(args, in_batched)]
    return jax.lax.map(lambda xs: fn(*xs), tuple(args)), True

  return wrapped


def _zero_past_total(y, group_sizes):
  rows = jax.lax.broadcasted_iota(jnp.int32, (y.shape[0], 1), 0)
  return jnp.where(rows < jnp.sum(group_sizes), y, jnp.zeros((), y.dtype))


def rows_matmul(x, w, group_sizes, *, transpose_w: bool = False,
                config: Config | None = None, covered: bool = False) -> jax.Array:
  """``x[n] @ w[g(n)]`` (``w[g(n)]^T`` with ``transpose_w``): [N, f] in x's dtype; rows
  past ``sum(group_sizes)`` are zero. ``covered``: the caller guarantees that the sizes
  sum to N, and the zeroing select (a full pass over the output) is skipped."""
  from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

  config = config or (DGRAD if transpose_w else FORWARD)
  _require("dgrad" if transpose_w else "fwd", x.shape, w.shape, x.dtype, config)
  if w.dtype != x.dtype:
    raise TypeError(f"x and w must share a dtype, got {x.dtype} and {w.dtype}")

  @_unbatched
  def call(x, w, group_sizes):
    y = ragged_dot_mgpu.ragged_dot(x, w, group_sizes=group_sizes, transpose_rhs=transpose_w,
                                   **config.kwargs())
    return y if covered else _zero_past_total(y, group_sizes)

  return call(x, w, group_sizes.astype(jnp.int32))


def wgrad(x, dy, group_sizes, *, config: Config = WGRAD) -> jax.Array:
  """``dw[g] = x_g^T dy_g``: [E, d, f] in x's dtype (rows past the sum are ignored)."""
  from jax.experimental.pallas.ops.gpu import transposed_ragged_dot_mgpu as trd

  _require("wgrad", x.shape, dy.shape, x.dtype, config)

  @_unbatched
  def call(x, dy, group_sizes):
    return trd.transposed_ragged_dot(x, dy.astype(x.dtype), group_sizes=group_sizes,
                                     **config.kwargs())

  return call(x, dy, group_sizes.astype(jnp.int32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _grouped(x, w, group_sizes, configs, covered):
  return rows_matmul(x, w, group_sizes, config=configs[0], covered=covered)


def _grouped_fwd(x, w, group_sizes, configs, covered):
  y = rows_matmul(x, w, group_sizes, config=configs[0], covered=covered)
  return y, (x, w, group_sizes)


def _grouped_bwd(configs, covered, res, dy):
  x, w, group_sizes = res
  dy = dy.astype(x.dtype)
  dx = rows_matmul(dy, w, group_sizes, transpose_w=True, config=configs[1], covered=covered)
  dw = wgrad(x, dy, group_sizes, config=configs[2])
  return dx, dw.astype(w.dtype), None


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *,
                   configs: tuple[Config, Config, Config] = (FORWARD, DGRAD, WGRAD),
                   covered: bool = False) -> jax.Array:
  """Differentiable grouped GEMM on the Mosaic GPU kernels: ``y[n] = x[n] @ w[g(n)]``.

  Args:
    x: [N, d] rows sorted by group, bf16 or f16.
    w: [E, d, f] one weight per group, x's dtype.
    group_sizes: int [E] summing to at most N; rows past the sum give zeros.
    configs: the (Fprop, Dgrad, Wgrad) kernel configurations.
    covered: the sizes sum to N (see :func:`rows_matmul`).

  Returns:
    [N, f] in x's dtype.

  Raises:
    ValueError: a shape that one of the three kernels cannot take (see :func:`problem`).
  """
  if x.ndim != 2 or w.ndim != 3 or group_sizes.shape != (w.shape[0],):
    raise ValueError(f"grouped_matmul needs x [N, d], w [E, d, f] and group_sizes [E]; got "
                     f"{x.shape}, {w.shape} and {group_sizes.shape}")
  n, f = x.shape[0], w.shape[2]
  for kind, xs, ws, c in (("fwd", x.shape, w.shape, configs[0]),
                          ("dgrad", (n, f), w.shape, configs[1]),
                          ("wgrad", x.shape, (n, f), configs[2])):
    _require(kind, xs, ws, x.dtype, c)
  return _grouped(x, w, group_sizes.astype(jnp.int32), tuple(configs), covered)


__all__ = ["DGRAD", "FORWARD", "WGRAD", "Config", "available", "grouped_matmul", "problem",
           "rows_matmul", "wgrad"]
