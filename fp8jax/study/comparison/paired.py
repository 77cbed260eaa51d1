"""Paired BF16/FP8 evaluation of one batch: the BF16 gradient once, then each policy.

    ev = PairedEvaluator(model, policies, mesh)
    base = ev.baseline(params, tokens)             # loss, grads, routing (on device)
    result = ev.variant("moe_l0_e4m3", params, tokens, base)   # small arrays only

Both passes use the training objective (LM loss + balance loss) on the same tokens with
the same params. The model is any :class:`fp8jax.models.api.Model` (its loss plus its
``aux_loss`` if any; routing metrics only when its aux has ``routing``). Each policy's
function is jitted once and stays compiled; the BF16 gradients stay on the devices and are
reused across the whole grid. Only the comparison (``fp8jax.metrics.compare_grads``), the
routing divergence and the finiteness flags leave the jitted function, so a policy costs
one forward + backward plus the metrics.

A policy with delayed-scaled sites (:mod:`fp8jax.models.delayed_sites`) is evaluated with
amax histories from warm-up passes: :meth:`PairedEvaluator.warm_state` runs its forward and
backward ``steps`` times over the batches of an evaluation window in turn (params fixed),
starting from empty histories, and :meth:`~PairedEvaluator.variant` takes the result::

    state = ev.warm_state("attn_l0_e4m3_delayed", params, window_batches, steps=4)
    result = ev.variant("attn_l0_e4m3_delayed", params, tokens, base, state)

The noise floor of a batch (:mod:`fp8jax.study.common.noise_floor`) is the same comparison for the
BF16 gradient at weights perturbed at BF16 rounding level::

    floor = ev.floor(params, tokens, base, noise_floor.floor_key(0, step, offset, b))
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import optax

from fp8jax import metrics
from fp8jax.gemm import operand_telemetry
from fp8jax.models import api, layer_stack
from fp8jax.study.common import noise_floor
from fp8jax.train import data_parallel as dp
from fp8jax.train import mesh as mesh_lib


class Baseline(NamedTuple):
  """The BF16 reference of one batch (device arrays)."""
  loss: jax.Array       # LM + balance loss, scalar
  lm_loss: jax.Array
  aux_loss: jax.Array
  grads: Any            # params-shaped float32
  grad_norm: jax.Array  # global L2 norm of grads
  routing: Any          # per MoE layer: topk_ids, topk_weights, expert_counts
  finite: jax.Array     # loss and every gradient finite
  nonfinite: jax.Array  # int32 index of the first non-finite gradient leaf (-1: none)


def _objective(model: api.Model, policy, moe_impl, moe_groups,
               telemetry: bool = False, deterministic: bool | None = None):
  """The training objective; its aux: LM loss, balance loss (0 without one), routing
  (``{}`` without) and, with ``telemetry``, the GEMM recipe's operand telemetry sums
  (``{}`` without a recipe)."""
  def loss_fn(params, tokens, delayed=None, param_transform=None):
    more = {} if param_transform is None else {"param_transform": param_transform}
    logits, aux = model.apply(params, tokens, policy, moe_impl=moe_impl,
                              moe_groups=moe_groups, delayed=delayed, telemetry=telemetry,
                              deterministic=deterministic, **more)
    lm = model.loss(logits, tokens)
    if "aux_loss" not in aux:
      return lm, (lm, jnp.zeros((), lm.dtype), aux.get("routing", {}),
                  aux.get("gemm_telemetry", {}))
    return lm + aux["aux_loss"], (lm, aux["aux_loss"], aux.get("routing", {}),
                                  aux.get("gemm_telemetry", {}))
  return loss_fn


def _per_device_grads(loss_fn, mesh, replicas, grad_specs=None, in_backward=False):
  """``jax.value_and_grad(loss_fn, has_aux=True)`` for ``loss_fn(params, tokens, delayed)
  -> (loss, (lm, aux_loss, routing, telemetry))`` (:func:`_objective`), each device on its
  own rows and the results combined (:mod:`fp8jax.train.data_parallel`): the program each
  device compiles is the one-device program at its share of the batch. ``grad_specs``:
  the gradients left split over the devices as these ``PartitionSpec``s say (a
  reduce-scatter), or None: whole on every device; ``in_backward`` (without
  ``grad_specs``; a model whose ``apply`` takes ``param_transform``): each layer's
  gradients averaged where the backward pass leaves the layer
  (:func:`fp8jax.train.data_parallel.mean_in_backward`), not all at its end."""
  def local(params, tokens, delayed):
    transform = dp.mean_in_backward if in_backward else None
    (loss, (lm, aux, routing, tel)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, tokens, delayed, transform)
    grads = layer_stack.unstack(grads)  # per layer, whatever the params' layout
    rows, counts = dp.split_routing(routing)
    if grad_specs is not None:
      grads = dp.mean_scattered(grads, grad_specs)
    elif not in_backward:
      grads = dp.mean(grads)
    return dp.mean((loss, lm, aux)), rows, counts, dp.operand_telemetry(tel), grads

  run = dp.per_device(local, mesh, in_specs=(dp.SAME, dp.ROWS, dp.SAME),
                      out_specs=(dp.SAME, dp.ROWS, dp.SAME, dp.SAME,
                                 dp.SAME if grad_specs is None else grad_specs),
                      replicas=replicas)

  def value_and_grad(params, tokens, delayed=None):
    (loss, lm, aux), rows, counts, tel, grads = run(params, tokens, delayed)
    return (loss, (lm, aux, dp.merge_routing(rows, counts), tel)), grads
  return value_and_grad


def _per_device_histories(loss_fn, mesh, replicas):
  """The updated amax histories (the gradient with respect to them, ``delayed ->
  histories``) of ``loss_fn(params, tokens, delayed)``, each device on its own rows,
  the amaxes combined by max (:mod:`fp8jax.train.data_parallel`)."""
  def local(delayed, params, tokens):
    return dp.maximum(jax.grad(lambda d: loss_fn(params, tokens, d)[0])(delayed))
  run = dp.per_device(local, mesh, in_specs=(dp.SAME, dp.SAME, dp.ROWS), out_specs=dp.SAME,
                      replicas=replicas)

  def warm(delayed, params, tokens):  # the compiled program's name
    return run(delayed, params, tokens)
  return warm


def _result(base: Baseline, loss, lm, aux, routing, grads, direct, classifier) -> dict:
  """The comparison of one gradient pass against the baseline (small arrays)."""
  result = metrics.compare_grads(base.grads, grads, base.routing or None, routing or None,
                                 direct=direct, loss_bf16=base.loss, loss_fp8=loss,
                                 classifier=classifier, finite_probe=True)
  # Each leaf's sums of squares, from the comparison's read of the gradients, are finite
  # where all its elements are: only otherwise are the gradients read again, element-wise.
  probe = result.pop("fp8_sq_finite")
  leaf_ok = lax.cond(jnp.all(probe), lambda: probe, lambda: _leaves_finite(grads))
  finite, first = _finite_leaves(loss, leaf_ok)
  return {"compare": result, "routing": metrics.routing_divergence(base.routing, routing),
          "lm_loss_fp8": lm, "aux_loss_fp8": aux, "finite": finite, "nonfinite": first}


def _telemetry(tel: dict) -> dict:
  """``{"global": stats, "<operand path>/<role>": stats}`` of the operand telemetry sums
  ``{path: {role: sums}}`` (:mod:`fp8jax.gemm.operand_telemetry`); global over every
  recorded operand."""
  parts = {f"{path}/{role}": sums for path, roles in tel.items()
           for role, sums in roles.items()}
  out = {k: operand_telemetry.summarize(v) for k, v in parts.items()}
  out["global"] = operand_telemetry.summarize(operand_telemetry.add(*parts.values()))
  return out


def _leaves_finite(grads):
  """bool [L]: whether every element of each gradient leaf is finite."""
  return jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)])


def _finiteness(loss, grads):
  """(all finite, index of the first non-finite gradient leaf or -1)."""
  return _finite_leaves(loss, _leaves_finite(grads))


def _finite_leaves(loss, leaf_ok):
  """(all finite, index of the first False of ``leaf_ok`` [L] or -1)."""
  first = jnp.where(jnp.all(leaf_ok), -1, jnp.argmin(leaf_ok)).astype(jnp.int32)
  return jnp.isfinite(loss) & jnp.all(leaf_ok), first


class PairedEvaluator:
  """Jitted BF16 and per-policy gradient passes over a data mesh.

  Args:
    model: the model (e.g. :func:`fp8jax.models.registry.get`).
    policies: the FP8 policies to compare (distinct names).
    mesh: a ``data`` mesh (params replicated, batch sharded); each device computes the
      gradients of its own rows (:mod:`fp8jax.train.data_parallel`), and the MoE
      dispatches each device's tokens.
    moe_impl: the MoE implementation of both passes (None: the model's own).
    floor_scale: the relative size of the noise floor's weight perturbation.
    telemetry: record the block-scale telemetry of the GEMM recipes' forward operands
      (:mod:`fp8jax.gemm.operand_telemetry`) in the results of policies with a recipe. It
      adds a few reductions per operand and compile time (on a CPU, about half again of
      the policy's compilation).
    deterministic: every pass in the deterministic mode (:mod:`fp8jax.train.determinism`:
      the same bits on every GPU run; None: as the model computes).
    replicas: the number of data-parallel replicas (default: one per device of ``mesh``;
      a multiple of them), each computing the gradients of its own rows.
  """

  def __init__(self, model: api.Model, policies, mesh, moe_impl: str | None = None,
               floor_scale: float = noise_floor.BF16_UNIT_ROUNDOFF, telemetry: bool = True,
               deterministic: bool | None = None, replicas: int | None = None):
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
      raise ValueError(f"policy names must be distinct, got {names}")
    if noise_floor.FLOOR in names:
      raise ValueError(f"the policy name {noise_floor.FLOOR!r} is reserved for the noise "
                       "floor; name the policy otherwise")
    if not isinstance(model, api.Model):
      raise TypeError(f"PairedEvaluator takes an fp8jax.models.api.Model (e.g. "
                      f"fp8jax.models.registry.get), got {type(model).__name__}")
    for p in policies:
      model.check(p)
    self.model, self.mesh, self.telemetry = model, mesh, telemetry
    self.objective = objective = functools.partial(_objective, deterministic=deterministic)
    self.policies = {p.name: p for p in policies}
    rep, data = mesh_lib.replicated(mesh), mesh_lib.batch_sharding(mesh)
    self.replicas = replicas or mesh.devices.size
    # The BF16 gradients stay split over the devices (fsdp_sharding: a reduce-scatter
    # instead of an all-reduce of 4 bytes per parameter); the metrics reduce them in place.
    grads = mesh_lib.fsdp_sharding(model.abstract_params(), mesh)
    grad_bf16 = _per_device_grads(objective(model, model.baseline, moe_impl, 1), mesh,
                                  self.replicas, jax.tree.map(lambda s: s.spec, grads))

    def baseline(params, tokens):
      (loss, (lm, aux, routing, _)), grads = grad_bf16(params, tokens)
      return Baseline(loss, lm, aux, grads, optax.tree.norm(grads), routing,
                      *_finiteness(loss, grads))

    # The jitted functions (``.lower`` them under ``jax.set_mesh(mesh)``); the methods
    # below call them under the mesh (see ``mesh_lib.under_mesh``). The routing stays
    # split along the batch as the devices computed it (None: as it comes).
    base = Baseline(rep, rep, rep, grads, rep, None, rep, rep)
    self.baseline_jit = jax.jit(baseline, in_shardings=(rep, data), out_shardings=base)
    self.variant_jits, self.warmup_jits = {}, {}
    # Committed to the mesh, as the warmed-up histories are: one compile per function.
    self.empty_state = {name: jax.device_put(model.delayed_init(p), rep)
                        for name, p in self.policies.items()}
    for name, policy in self.policies.items():
      direct = model.direct(policy)
      self.variant_jits[name] = jax.jit(
          self._variant_fn(policy, direct, moe_impl), in_shardings=(rep, data, base, rep),
          out_shardings=rep)
      if self.empty_state[name]:
        self.warmup_jits[name] = jax.jit(
            _per_device_histories(objective(model, policy, moe_impl, 1), mesh, self.replicas),
            in_shardings=(rep, rep, data), out_shardings=rep)
    self.floor_scale = floor_scale
    self.store_jit = jax.jit(model.store, out_shardings=rep)
    self.floor_jit = jax.jit(self._floor_fn(moe_impl), in_shardings=(rep, data, base, rep),
                             out_shardings=rep)

  def _variant_fn(self, policy, direct, moe_impl):
    grad_fp8 = _per_device_grads(self.objective(self.model, policy, moe_impl, 1,
                                                self.telemetry), self.mesh, self.replicas,
                                 in_backward=self.model.param_transform)

    def variant(params, tokens, base: Baseline, delayed):
      (loss, (lm, aux, routing, tel)), grads = grad_fp8(params, tokens, delayed)
      out = _result(base, loss, lm, aux, routing, grads, direct, self.model.classifier)
      if tel:
        out["telemetry"] = _telemetry(tel)
      return out

    return variant

  def _floor_fn(self, moe_impl):
    grad_bf16 = _per_device_grads(self.objective(self.model, self.model.baseline, moe_impl,
                                                 1), self.mesh, self.replicas,
                                  in_backward=self.model.param_transform)

    def floor(params, tokens, base: Baseline, key):
      moved = noise_floor.perturb(params, key, self.floor_scale)  # the per-layer draws
      (loss, (lm, aux, routing, _)), grads = grad_bf16(moved, tokens)
      out = _result(base, loss, lm, aux, routing, grads, None, self.model.classifier)
      out["perturbation_norm"] = optax.tree.norm(jax.tree.map(  # summed per layer
          lambda a, b: a.astype(jnp.float32) - b.astype(jnp.float32),
          *(layer_stack.unstack(t) for t in (moved, params))))
      return out

    return floor

  def store(self, params):
    """``params`` (per layer) in the layout the model computes on (``model.store``),
    replicated over the mesh; ``jax.ShapeDtypeStruct`` leaves stay abstract."""
    if all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params)):
      return self.model.store(params)
    return mesh_lib.under_mesh(self.store_jit, self.mesh)(params)

  def baseline(self, params, tokens) -> Baseline:
    base = mesh_lib.under_mesh(self.baseline_jit, self.mesh)(params, tokens)
    # Whole on every device, as :meth:`lowerings` compiles the later calls for: a small
    # gather here (B x S x top-k ids and weights) keeps the collectives out of them.
    return base._replace(routing=jax.device_put(base.routing, mesh_lib.replicated(self.mesh)))

  def variant(self, name: str, params, tokens, base: Baseline, delayed=None) -> dict:
    """The comparison of policy ``name`` against ``base`` (small device arrays); ``delayed``:
    its amax histories (:meth:`warm_state`; None: empty, as after no warm-up)."""
    self._check_name(name)
    delayed = self.empty_state[name] if delayed is None else delayed
    return mesh_lib.under_mesh(self.variant_jits[name], self.mesh)(params, tokens, base,
                                                                   delayed)

  def floor(self, params, tokens, base: Baseline, key) -> dict:
    """The noise floor against ``base``: the BF16 gradient at weights perturbed at BF16
    rounding level with ``key`` (:mod:`fp8jax.study.common.noise_floor`), compared like a policy
    (:meth:`variant`'s result, plus ``perturbation_norm``, the perturbation's L2 norm)."""
    return mesh_lib.under_mesh(self.floor_jit, self.mesh)(params, tokens, base, key)

  def warm_state(self, name: str, params, window, steps: int):
    """The amax histories of policy ``name`` after ``steps`` warm-up passes (forward and
    backward, params unchanged) over the batches of ``window`` (a list of token arrays, as
    :meth:`variant` takes them) in turn, from empty histories; ``{}`` for a policy without
    delayed-scaled sites."""
    self._check_name(name)
    if steps < 0:
      raise ValueError(f"delayed-scaling warm-up steps must be >= 0, got {steps}")
    state = self.empty_state[name]
    if state and steps and not window:
      raise ValueError(f"policy {name!r}: warm-up needs at least one batch")
    for i in range(steps if state else 0):
      state = mesh_lib.under_mesh(self.warmup_jits[name], self.mesh)(
          state, params, window[i % len(window)])
    return state

  def lowerings(self, params, tokens, names, floor_key=None) -> dict:
    """``{label: thunk}``: each thunk lowers one function the comparison of policies
    ``names`` (the floor included) calls, for ``params`` and ``tokens`` (arrays or
    ``jax.ShapeDtypeStruct``s, laid out as the calls' inputs): the BF16 baseline, each
    policy's pass and warm-up, the floor's pass (with ``floor_key``). For
    :func:`fp8jax.train.parallel_compile.fill_cache`."""
    lower = lambda jitted, *args: lambda: mesh_lib.under_mesh(  # noqa: E731
        jitted.lower, self.mesh)(*args)
    base = mesh_lib.under_mesh(  # ShapeDtypeStructs with the baseline's out_shardings
        lambda p, t: jax.eval_shape(self.baseline_jit, p, t), self.mesh)(params, tokens)
    base = base._replace(routing=jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=mesh_lib.replicated(self.mesh)), base.routing))
    out = {"the BF16 baseline": lower(self.baseline_jit, params, tokens)}
    for name in names:
      if name == noise_floor.FLOOR:
        out["the noise floor"] = lower(self.floor_jit, params, tokens, base, floor_key)
        continue
      self._check_name(name)
      out[f"policy {name}"] = lower(self.variant_jits[name], params, tokens, base,
                                    self.empty_state[name])
      if name in self.warmup_jits:
        out[f"the warm-up of policy {name}"] = lower(self.warmup_jits[name],
                                                     self.empty_state[name], params, tokens)
    return out

  def _check_name(self, name: str) -> None:
    if name not in self.variant_jits:
      raise ValueError(f"unknown policy {name!r}; this evaluator has "
                       f"{sorted(self.variant_jits)}")


def leaf_path(params, index: int) -> str:
  """The path of the ``index``-th leaf of ``params`` (for naming a non-finite gradient)."""
  return list(metrics.flatten(params))[index]
