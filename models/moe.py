"""Routing, balance losses and dropless expert computation for DeepSeek-MoE.

Shapes: T tokens (batch x sequence flattened), d hidden, E routed experts, K experts per
token, f expert width. Expert weights are stacked: gate/up [E, d, f], down [E, f, d].
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

from fp8jax.gemm import grouped as grouped_gemm
from fp8jax.gemm import grouped_operands, operand_telemetry, padding


def router_logits(x: jax.Array, router: jax.Array) -> jax.Array:
  """The router's logits [T, E]: ``x @ router`` in x's (the compute) dtype. No precision
  policy reaches it: it is not a GEMM of the recipes (``fp8_dot_general``), nor a site."""
  return jnp.dot(x, router.astype(x.dtype))


def route(x: jax.Array, router: jax.Array, k: int, norm_topk_prob: bool):
  """Softmax router (on :func:`router_logits`, in float32) with greedy top-k.

  Args:
    x: [T, d] router input (model dtype).
    router: [d, E] router weight.
    k: experts per token.
    norm_topk_prob: divide the top-k weights by their sum (+1e-20).

  Returns:
    ``(scores [T, E] float32, weights [T, K] float32, ids [T, K] int32)``.
  """
  scores = jax.nn.softmax(router_logits(x, router).astype(jnp.float32), axis=-1)
  weights, ids = lax.top_k(scores, k)
  if norm_topk_prob and k > 1:
    weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
  return scores, weights, ids


def balance_loss(scores: jax.Array, ids: jax.Array, batch: int, alpha: float,
                 seq_aux: bool) -> jax.Array:
  """DeepSeek-MoE balance loss ``alpha * sum_i f_i P_i`` (per sequence if ``seq_aux``).

  Args:
    scores: [T, E] softmax scores, T = batch * seq.
    ids: [T, K] chosen experts.
    batch: number of sequences.
    alpha: the loss weight.
    seq_aux: per-sequence statistics averaged over sequences, else over all tokens.
  """
  t, e = scores.shape
  k = ids.shape[-1]
  groups = batch if seq_aux else 1
  per = t // groups
  picks = jax.nn.one_hot(ids.reshape(groups, per * k), e, dtype=jnp.float32).sum(axis=1)
  f = picks / (per * k / e)
  p = scores.reshape(groups, per, e).mean(axis=1)
  return alpha * jnp.mean(jnp.sum(f * p, axis=-1))


def glu(gate, up, limit: float | None = None):
  """SwiGLU's activation ``silu(gate) * up``. With ``limit`` (DeepSeek-V4's
  ``swiglu_limit``) the pre-activations are clamped first, as V4's experts do: the gate
  from above only, ``min(gate, limit)``, the up (linear) path to ``[-limit, limit]``; a
  value at the limit keeps its gradient (``torch.clamp``'s), one past it gets none. The
  limit as the operands' dtype represents it; None: unclamped (the same ops as without)."""
  if limit is not None:
    gate = jnp.where(gate > limit, limit, gate).astype(gate.dtype)
    up = jnp.where(up > limit, limit, jnp.where(up < -limit, -limit, up)).astype(up.dtype)
  return jax.nn.silu(gate) * up


def swiglu(x, gate, up, down, dot, limit: float | None = None):
  """``down(glu(x gate, x up, limit))`` with the matmul ``dot(a, b)``."""
  return dot(glu(dot(x, gate), dot(x, up), limit), down)


def experts_reference(x, weights, ids, gate, up, down, limit: float | None = None):
  """Every token through every expert, then the top-k combination (tests only);
  ``limit``: :func:`glu`'s.

  Returns:
    [T, d] in x's dtype.
  """
  e = gate.shape[0]
  h = glu(jnp.einsum("td,edf->tef", x, gate), jnp.einsum("td,edf->tef", x, up), limit)
  out = jnp.einsum("tef,efd->ted", h, down)
  combine = jnp.sum(jax.nn.one_hot(ids, e, dtype=jnp.float32) * weights[..., None], axis=1)
  return jnp.einsum("ted,te->td", out.astype(jnp.float32), combine).astype(x.dtype)


@jax.custom_vjp
def permute_rows(x: jax.Array, perm: jax.Array, inverse: jax.Array) -> jax.Array:
  """``x[perm]`` for a permutation ``perm`` of the rows of x [N, ...] whose inverse is
  ``inverse``. Its transpose is the gather ``g[inverse]``, not the scatter-add that
  differentiating a gather gives: both directions are row gathers."""
  return _rows(x, perm)


def _rows(x, index):
  """x[index] along the rows; out-of-range indices give zero rows."""
  return jnp.take(x, index, axis=0, mode="fill", fill_value=0)


def _permute_fwd(x, perm, inverse):
  return _rows(x, perm), (perm, inverse)


def _permute_bwd(res, g):
  perm, inverse = res
  return _rows(g, inverse), None, None


permute_rows.defvjp(_permute_fwd, _permute_bwd)


def experts_dispatch(x, weights, ids, gate, up, down,
                     grouped_matmul=grouped_gemm.padded_grouped_matmul, group_multiple: int = 1,
                     fuse_gate_up: bool = False, once=None, limit: float | None = None):
  """Dropless sort-based dispatch with static shapes.

  The T*K (token, slot) pairs are sorted by expert, pushed through ``grouped_matmul``
  (replaceable by a faster grouped GEMM), un-sorted and combined with the top-k
  weights in float32. The group sizes always sum to T*K (every pair has an expert). The
  sort and un-sort are row gathers in both directions (:func:`permute_rows`); the only
  reduction over the K copies of a token is a sum.

  With ``group_multiple`` m > 1 the sort lays every expert's group out padded with zero
  rows to a multiple of m (``fp8jax.gemm.padding``), for an FP8 grouped GEMM whose Wgrad
  quantizes in tiles along the tokens (``fp8_ragged_dot(..., group_multiple=m)``): the
  gathers place the rows there directly, the padding rows are never read back, and their
  gradients are zeros.

  With ``fuse_gate_up`` the gate and up projections are one grouped GEMM against the
  weights concatenated along the width ([E, d, 2f]): the same forward values, one wider
  GEMM in each direction (the Dgrad then sums over 2f in one contraction). Only for GEMMs
  without per-tensor scaling: a quantized GEMM would scale the two weights together.

  ``once``: the three weights as already quantized for ``fp8_ragged_dot`` (its ``w_once``;
  :func:`experts_weights_once`), or None; with ``fuse_gate_up`` the GEMM quantizes the
  concatenated weights itself and only the down projection's is used. ``limit``: the
  activation's clamp (:func:`glu`).

  Returns:
    [T, d] in x's dtype.
  """
  t, k = ids.shape
  e = gate.shape[0]
  flat = ids.reshape(-1)
  n = flat.shape[0]
  order = jnp.argsort(flat, stable=True)
  sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
  if group_multiple > 1:  # padded row -> (token, slot) pair; n for padding rows
    n_pad = padding.padded_count(n, e, group_multiple)
    source, _ = padding.padded_rows(sizes, n, n_pad, group_multiple)
    order = jnp.take(order, source, mode="fill", fill_value=n)
  inverse = jnp.zeros((n,), order.dtype).at[order].set(
      jnp.arange(order.shape[0], dtype=order.dtype), mode="drop")
  copies = jnp.broadcast_to(x[:, None, :], (t, k, x.shape[-1])).reshape(t * k, -1)
  x_sorted = permute_rows(copies, order, inverse)
  def mm(a, w, n, q):
    return grouped_matmul(a, w, n) if q is None else grouped_matmul(a, w, n, w_once=q)

  qg, qu, qd = (None, None, None) if once is None else once
  if fuse_gate_up:
    f = gate.shape[-1]
    both = grouped_matmul(x_sorted, jnp.concatenate([gate, up], -1).astype(x.dtype), sizes)
    h = glu(both[:, :f], both[:, f:], limit)
  else:
    h = glu(mm(x_sorted, gate.astype(x.dtype), sizes, qg),
            mm(x_sorted, up.astype(x.dtype), sizes, qu), limit)
  out_sorted = mm(h, down.astype(x.dtype), sizes, qd)
  out = permute_rows(out_sorted, inverse, order).reshape(t, k, -1)
  return jnp.einsum("tkd,tk->td", out.astype(jnp.float32), weights).astype(x.dtype)


def expert_counts(ids: jax.Array, num_experts: int) -> jax.Array:
  """Tokens routed to each expert: int32 [E]."""
  return jnp.bincount(ids.reshape(-1), length=num_experts).astype(jnp.int32)


def dispatch_groups(args, groups: int, grouped: tuple, per_device: bool,
                    fuse_gate_up: bool = False, once=None, limit: float | None = None):
  """Sorted dropless dispatch per group of sequences (vmapped over the groups), with
  ``grouped`` = (grouped GEMM, group row multiple) from
  :func:`fp8jax.gemm.grouped.matmul_for`.

  With ``per_device`` (a Pallas GEMM) and ``groups`` > 1 under a context mesh
  (``jax.set_mesh``) whose ``data`` axis has ``groups`` devices, each device runs its own
  group in a ``shard_map``: XLA cannot partition a kernel's custom call and would
  otherwise gather every group onto every device.

  ``once``: the routed weights as quantized once (:func:`experts_dispatch`), or None;
  ``limit``: the activation's clamp (:func:`glu`).

  Returns:
    [groups, T / groups, d].
  """
  split = lambda a: a.reshape(groups, a.shape[0] // groups, *a.shape[1:])  # noqa: E731
  matmul, multiple = grouped
  dispatch = functools.partial(experts_dispatch, grouped_matmul=matmul,
                               group_multiple=multiple, fuse_gate_up=fuse_gate_up, once=once,
                               limit=limit)
  per_group = jax.vmap(dispatch, in_axes=(0, 0, 0, None, None, None))
  mesh = jax.sharding.get_abstract_mesh()
  if per_device and groups > 1 and not mesh.empty and mesh.shape.get("data") == groups:
    data, rep = jax.sharding.PartitionSpec("data"), jax.sharding.PartitionSpec()
    per_group = jax.shard_map(per_group, in_specs=(data,) * 3 + (rep,) * 3, out_specs=data,
                              check_vma=False)  # the kernel has no varying-axes rule
  return per_group(*map(split, args[:3]), *args[3:])


def experts_weights_once(weights, dtype, config, telemetry: bool):
  """The routed experts' (gate, up, down) weights, each quantized once for the grouped
  GEMM (``fp8_ragged_dot``'s ``w_once``) from the parameters as given (float32), as the
  GEMM would quantize them cast to ``dtype``; with ``telemetry`` also each weight's
  operand telemetry sums from the same read, keyed as in :func:`experts_telemetry`.
  None where ``grouped_operands.weight_once`` does not hold for ``config``.

  Returns:
    ``(once, sums)``: a tuple of three QTensors (or None) and a dict (or None).
  """
  if config is None or not grouped_operands.weight_once(config):
    return None, None
  out = [grouped_operands.weights_once(w, config, dtype, telemetry) for w in weights]
  sums = ({f"weight_{n}": s for n, (_, s) in zip(("gate", "up", "down"), out)}
          if telemetry else None)
  return tuple(q for q, _ in out), sums


def experts_telemetry(args, roles, weight_sums=None) -> dict:
  """Telemetry sums of the routed experts' forward operands: their input rows (each token
  once, not once per chosen expert: 1 x K tiles and tensor amaxes do not depend on the
  rows' order or repeats) and each stacked weight as the grouped GEMM quantizes it (W_e^T
  [E, N, K], each expert a tensor of its own), or ``weight_sums`` where the weights' sums
  came with their quantization (:func:`experts_weights_once`). The down projection's
  input rows are inside the dispatch and not recorded."""
  rows, _, _, gate, up, down = args
  swap = lambda w: jnp.swapaxes(w, -1, -2)  # noqa: E731
  if weight_sums is None:
    weight_sums = {f"weight_{n}": operand_telemetry.expert_sums(swap(w), roles.weight)
                   for n, w in (("gate", gate), ("up", up), ("down", down))}
  return {"input": operand_telemetry.operand_sums(rows, roles.input), **weight_sums}
