"""The MoE experts' grouped GEMM on GPUs: per direction, the faster of two Pallas kernels.

``grouped_matmul(x, w, group_sizes)`` (``y[n] = x[n] @ w[g(n)]``, rows sorted by group)
with a custom VJP whose Fprop, Dgrad and Wgrad each run on

* ``"mosaic"``: the Mosaic GPU (wgmma + TMA) kernels that JAX ships
  (:mod:`fp8jax.kernels.grouped_matmul_mosaic`; Hopper only, some shapes only), or
* ``"triton"``: the project's Triton kernels (:mod:`fp8jax.kernels.grouped_matmul_triton`;
  any shape, any CUDA GPU; JAX has deprecated its Pallas Triton backend).

:data:`PREFERRED` holds the choice measured at the 2B and 16B shapes on Hopper
(``scripts/bench/mosaic_grouped.py``,
``docs/performance/archive/2026-11-23_third_pass_mosaic_cudnn.md``). A direction whose Mosaic
kernel cannot take the shape (see :func:`grouped_matmul_mosaic.problem`) or that runs on a
GPU other than Hopper uses the Triton kernel. Outputs equal those of either kernel alone
(float32 accumulation, rows past ``sum(group_sizes)`` zero).

These kernels multiply BF16 operands with the tensor cores' own FP32 accumulation; the
model uses them (``moe_impl="pallas"``) only without a GEMM policy. A policy's simulated
low-precision GEMM, whatever its accumulator, runs the XLA simulation of
``fp8jax.gemm.grouped`` under every ``moe_impl``: no kernel here models the tensor-core
accumulator (13 fraction bits, promotion every 128) of ``gemm:hopper_blockwise``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fp8jax.kernels import grouped_matmul_mosaic as mosaic
from fp8jax.kernels import grouped_matmul_triton as triton

DIRECTIONS = ("fwd", "dgrad", "wgrad")
PREFERRED = {"fwd": "mosaic", "dgrad": "triton", "wgrad": "mosaic"}
"""The kernel per direction, from the sweeps at the 2B and 16B shapes on Hopper
(docs/performance/archive/2026-11-23_third_pass_mosaic_cudnn.md): Fprop ties, so the
maintained Mosaic kernel; Dgrad the faster, Triton; Wgrad the faster, Mosaic (by more
than 2x)."""


def choose(x_shape, w_shape, dtype, preferred: dict | None = None,
           hopper: bool | None = None) -> dict[str, str]:
  """``{direction: "mosaic" | "triton"}`` for x [N, d] and w [E, d, f]."""
  preferred = PREFERRED if preferred is None else preferred
  hopper = mosaic.available() if hopper is None else hopper
  n, (_, _, f) = x_shape[0], w_shape
  shapes = {"fwd": (x_shape, w_shape), "dgrad": ((n, f), w_shape),
            "wgrad": (x_shape, (n, f))}
  config = {"fwd": mosaic.FORWARD, "dgrad": mosaic.DGRAD, "wgrad": mosaic.WGRAD}
  out = {}
  for kind in DIRECTIONS:
    ok = hopper and mosaic.problem(kind, *shapes[kind], dtype, config[kind]) is None
    out[kind] = "mosaic" if ok and preferred[kind] == "mosaic" else "triton"
  return out


def _rows(impl, x, w, group_sizes, transpose_w, covered):
  if impl == "mosaic":
    return mosaic.rows_matmul(x, w, group_sizes, transpose_w=transpose_w, covered=covered)
  return triton.rows_matmul(x, w, group_sizes, transpose_w=transpose_w,
                            interpret=jax.default_backend() != "gpu")


def _wgrad(impl, x, dy, group_sizes):
  if impl == "mosaic":
    return mosaic.wgrad(x, dy, group_sizes)
  return triton.wgrad(x, dy, group_sizes, interpret=jax.default_backend() != "gpu")


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _grouped(x, w, group_sizes, impls, covered):
  return _rows(impls[0], x, w, group_sizes, False, covered)


def _grouped_fwd(x, w, group_sizes, impls, covered):
  return _rows(impls[0], x, w, group_sizes, False, covered), (x, w, group_sizes)


def _grouped_bwd(impls, covered, res, dy):
  x, w, group_sizes = res
  dy = dy.astype(x.dtype)
  dx = _rows(impls[1], dy, w, group_sizes, True, covered)
  dw = _wgrad(impls[2], x, dy, group_sizes)
  return dx, dw.astype(w.dtype), None


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *,
                   impls: dict[str, str] | None = None, covered: bool = False
                   ) -> jax.Array:
  """Differentiable grouped GEMM with a kernel per direction.

  Args:
    x: [N, d] rows sorted by group (bf16 for the tensor cores).
    w: [E, d, f] one weight per group, x's dtype.
    group_sizes: int [E] summing to at most N; rows past the sum give zeros.
    impls: ``{direction: "mosaic" | "triton"}``; default :func:`choose`.
    covered: the caller guarantees that the sizes sum to N (the MoE dispatch): the Mosaic
      kernels' rows past the total are then not zeroed (there are none).

  Returns:
    [N, f] in x's dtype.
  """
  if x.ndim != 2 or w.ndim != 3 or group_sizes.shape != (w.shape[0],):
    raise ValueError(f"grouped_matmul needs x [N, d], w [E, d, f] and group_sizes [E]; got "
                     f"{x.shape}, {w.shape} and {group_sizes.shape}")
  impls = impls or choose(x.shape, w.shape, x.dtype)
  unknown = set(impls.values()) - {"mosaic", "triton"}
  if unknown or set(impls) != set(DIRECTIONS):
    raise ValueError(f"impls must map {DIRECTIONS} to 'mosaic' or 'triton', got {impls}")
  return _grouped(x, w, group_sizes.astype(jnp.int32),
                  tuple(impls[k] for k in DIRECTIONS), covered)


__all__ = ["DIRECTIONS", "PREFERRED", "choose", "grouped_matmul"]
