"""Float64 reference of a linear layer's three GEMMs on six separately quantized operand
copies: X and W for Fprop, dY and W^T for Dgrad, X^T and dY^T for Wgrad.

Written from the contract (docs/formats.md, Transformer Engine's ``HybridQuantizer``,
PR #2817), not from fp8jax's code. The quantizer is the caller's: ``quant(copy, a)`` returns
the dequantized quantization (float32) of ``a`` [R, C] (contraction along C) with the spec
of ``copy`` ("fprop_input", "fprop_weight", "dgrad_grad", "dgrad_weight", "wgrad_input",
"wgrad_grad"). A second copy is quantized from the original tensor, or from the first
copy's dequantized values for the tensors in ``from_forward`` (all three with
``double``). Products are float64 sums of the float32 dequantized operands.
"""

from __future__ import annotations

import numpy as np

F64 = np.float64


def _sources(x, w_t, dy, xq, wq, dyq, from_forward, double):
  """The sources of the second copies: the originals, or the first copies' values."""
  return (xq if double or "input" in from_forward else x,
          wq if double or "weight" in from_forward else w_t,
          dyq if double else dy)


def dense_layer(x, w, dy, quant, from_forward=(), double=False):
  """``(Y [M, N], dX [M, K], dW [K, N])`` float64 for x [M, K], w [K, N], dy [M, N]."""
  xq, wq, dyq = quant("fprop_input", x), quant("fprop_weight", w.T), quant("dgrad_grad", dy)
  x_src, w_src, dy_src = _sources(x, w.T, dy, xq, wq, dyq, from_forward, double)
  wtq = quant("dgrad_weight", w_src.T)  # [K, N]
  xtq, dytq = quant("wgrad_input", x_src.T), quant("wgrad_grad", dy_src.T)  # [K, M], [N, M]
  return (xq.astype(F64) @ wq.astype(F64).T, dyq.astype(F64) @ wtq.astype(F64).T,
          xtq.astype(F64) @ dytq.astype(F64).T)


def _padded(v, sizes, multiple):
  """The rows of ``v`` [N, C], each group followed by zero rows up to a multiple of
  ``multiple``; and each group's row slice in that layout."""
  parts, slices, start, at = [], [], 0, 0
  for n in sizes:
    n_pad = -(-n // multiple) * multiple
    part = np.zeros((n_pad, v.shape[1]), v.dtype)
    part[:n] = v[start:start + n]
    parts.append(part)
    slices.append(slice(at, at + n_pad))
    start, at = start + n, at + n_pad
  return np.concatenate(parts), slices


def grouped_layer(x, w, dy, sizes, quant, multiple=1, from_forward=(), double=False):
  """``(Y [N, F], dX [N, K], dW [E, K, F])`` float64 for rows x [N, K] sorted by group,
  weights w [E, K, F], dy [N, F] and ``sizes`` (summing to N). X and dY are each one tensor
  (one per-tensor level), each expert's weight a tensor of its own; for Wgrad every group
  is zero-padded to a multiple of ``multiple`` rows before X^T and dY^T are quantized."""
  bounds = np.cumsum([0, *sizes])
  rows = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
  xq, dyq = quant("fprop_input", x), quant("dgrad_grad", dy)
  y = np.zeros((x.shape[0], w.shape[2]))
  dx = np.zeros(x.shape)
  for e, r in enumerate(rows):
    wq = quant("fprop_weight", w[e].T)  # [F, K]
    w_src = _sources(None, w[e].T, None, None, wq, None, from_forward, double)[1]
    wtq = quant("dgrad_weight", w_src.T)  # [K, F]
    y[r] = xq[r].astype(F64) @ wq.astype(F64).T
    dx[r] = dyq[r].astype(F64) @ wtq.astype(F64).T
  xp, slices = _padded(x, sizes, multiple)
  dyp, _ = _padded(dy, sizes, multiple)
  x_src, _, dy_src = _sources(xp, None, dyp, quant("fprop_input", xp), None,
                              quant("dgrad_grad", dyp), from_forward, double)
  xtq, dytq = quant("wgrad_input", x_src.T), quant("wgrad_grad", dy_src.T)  # [K|F, N_pad]
  dw = np.stack([xtq[:, s].astype(F64) @ dytq[:, s].astype(F64).T for s in slices])
  return y, dx, dw
