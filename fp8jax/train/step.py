"""The jitted training step of any model (:class:`fp8jax.models.api.Model`).

The objective is the model's loss plus its ``aux_loss``, if it has one (DeepSeek-MoE's
balance loss); both are reported separately.

A step whose loss, gradients or gradient norm are not finite, or that reads a non-finite
parameter, leaves params and optimizer state unchanged and reports which parameters are
non-finite themselves, then which have non-finite gradients, then an overflowing gradient
norm (:func:`first_nonfinite`): a NaN parameter makes most gradients NaN, so the
parameters are checked first. The decision is made before the update, from what the step
reads, so that XLA fuses the keep-or-not select into the update (docs/performance.md:
The non-finite guard). An update that is itself non-finite from
finite inputs (a NaN optimizer state, a learning rate that overflows the weights) is then
applied, and found by the next step's check of its params or by the training loop before
it saves a checkpoint (:func:`state_finite`). ``check_update=True`` also refuses such a
step before applying it ("new_params/<path>"), at the cost of one more pass over the new
params.

The params (and the optimizer state) may be stored stacked per run of alike layers
(:mod:`fp8jax.models.layer_stack`; ``seeded_init(..., stacked=True)``): the gradients and
updates then keep that layout, and non-finite values are still named per layer.

A policy with delayed-scaled sites carries their amax histories in the train state
(``delayed``, :mod:`fp8jax.models.delayed_sites`; ``{}`` for other policies): each step
quantizes with them and stores the updated histories, except a non-finite step.

Precision options (``make_train_step`` keywords; the run config's ``precision`` group):

* BF16 (or other low-precision) master weights: the gradients and params reach the
  optimizer in float32 and ``optax.apply_updates`` rounds ``p + update`` back to the
  params' dtype (round to nearest even); float32 params are unaffected.
* ``loss_scale`` (:class:`fp8jax.train.loss_scale.DynamicLossScale`): the gradient of
  ``loss * S``, divided by ``S``; a non-finite step is skipped and backs ``S`` off instead
  of stopping the run (the state's ``loss_scale`` dict; ``{}`` without it). Metrics add
  ``loss_scale`` (after the step), ``skipped_steps`` (cumulative) and ``skipped`` (this
  step was non-finite and absorbed by the back-off).
* ``fp8_param_gather``: the forward uses the weights after a simulated FP8 gather
  (:mod:`fp8jax.train.param_gather`), straight-through to the master weights.
* ``with_routing``: ``metrics["routing"]`` holds the forward's routing (per MoE layer
  ``topk_ids``, ``topk_weights``, ``expert_counts``, as ``deepseek_moe.apply`` returns it;
  ``{}`` for a model without a router).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fp8jax.models import api, layer_stack
from fp8jax.train import data_parallel as dp
from fp8jax.train import loss_scale as loss_scale_lib
from fp8jax.train import param_gather


class TrainState(NamedTuple):
  step: jax.Array  # applied updates (a skipped step does not count)
  params: Any
  opt_state: Any
  delayed: Any = {}  # per-site amax histories (models.delayed_sites); {}: none
  loss_scale: Any = {}  # dynamic loss scaling (train.loss_scale); {}: off


def init_state(params, tx: optax.GradientTransformation, delayed=None,
               loss_scale=None) -> TrainState:
  """Step 0; ``delayed``: the policy's empty histories (``delayed_sites.init``), if any;
  ``loss_scale``: ``DynamicLossScale.init_state()``, if loss scaling is on."""
  return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), delayed or {},
                    loss_scale or {})


def _check_model(model) -> api.Model:
  if not isinstance(model, api.Model):
    raise TypeError(f"takes an fp8jax.models.api.Model (fp8jax.models.registry.get, e.g. "
                    f"'deepseek_moe:tiny'), got {type(model).__name__}")
  return model


def seeded_init(model: api.Model, tx: optax.GradientTransformation,
                policy=None, master_weights: str = "float32",
                loss_scale: loss_scale_lib.DynamicLossScale | None = None,
                stacked: bool = False):
  """``init(seed) -> TrainState`` at step 0: params of init seed ``seed`` (an int, or an
  int32 scalar under ``jax.vmap``) in ``master_weights`` (rounded to nearest even), the
  optimizer state, the policy's (default: the baseline's) empty amax histories and
  ``loss_scale``'s state, if on; ``stacked``: the params (and so the optimizer state)
  stored stacked per run of alike layers under ``policy``
  (:mod:`fp8jax.models.layer_stack`; a model whose ``layer_runs`` is None refuses)."""
  model = _check_model(model)
  policy = model.baseline if policy is None else policy
  delayed = model.delayed_init(policy)
  if stacked and model.layer_runs is None:
    raise ValueError(f"the model {model.name!r} does not store its layers stacked")
  groups = model.layer_runs(policy) if stacked else None

  def init(seed):
    params = model.init(jax.random.key(seed))
    if master_weights != "float32":
      params = jax.tree.map(lambda x: x.astype(jnp.dtype(master_weights)), params)
    if groups is not None:
      params = layer_stack.stack(params, groups)
    return init_state(params, tx, delayed, loss_scale and loss_scale.init_state())
  return init


def _float32(tree):
  return jax.tree.map(lambda x: x.astype(jnp.float32), tree)


def make_train_step(model: api.Model, tx: optax.GradientTransformation, policy=None, *,
                    loss_scale: loss_scale_lib.DynamicLossScale | None = None,
                    fp8_param_gather: bool = False, with_routing: bool = False, mesh=None,
                    replicas: int | None = None, reduce_per_layer: bool = False,
                    param_specs=None, gather_dtype=None, check_update: bool = False):
  """Returns ``step(state, tokens) -> (state, metrics)`` (jit it, or shard it) of
  ``model`` (:class:`fp8jax.models.api.Model`, which carries how it computes: e.g.
  DeepSeek-MoE's MoE kernel, groups, deterministic mode and layer scan, its registry
  options) under ``policy`` (default: its baseline); ``mesh``: a ``data`` mesh whose
  devices each compute the gradients of their own rows (:mod:`fp8jax.train.data_parallel`;
  the state replicated; ``replicas``: their number, default one per device), or None: one
  program over the global batch, partitioned by XLA (FSDP's sharded state takes this
  route); the keywords: the precision options of the module docstring;
  ``reduce_per_layer`` (with ``mesh``): each
  layer's gradients averaged over the replicas where the backward pass leaves that layer
  (:func:`fp8jax.train.data_parallel.mean_in_backward`), so that XLA may overlap those
  all-reduces with the rest of the backward pass; False (the default): the whole gradient
  averaged at its end, the faster on 2 and 4 GPUs (XLA hid less of the per-layer
  all-reduces behind the backward pass;
  docs/performance/archive/2026-11-28_several_gpus_overlap_fsdp.md). The same values
  either way. ``param_specs`` (with ``mesh``; FSDP):
  the params (and the optimizer state) split over the devices as these ``PartitionSpec``s
  say (``mesh.fsdp_sharding``'s specs), each device gathering a part's weights where the
  model uses it and receiving its part of the gradients by a reduce-scatter in the
  backward pass (:func:`fp8jax.train.data_parallel.gather_in_forward`): one part's
  weights whole at a time, and no whole gradient, per device; ``gather_dtype`` (with
  ``param_specs``): the split weights cast to it before they are gathered, their gradient
  reduce-scattered in the params' dtype (:func:`fp8jax.train.data_parallel.gather_in_forward`;
  the same values when it is ``cfg.dtype``, to which the model casts every split weight);
  ``check_update``: a step whose update would make a parameter non-finite is refused too
  (the module docstring)."""

  model = _check_model(model)
  policy = model.baseline if policy is None else policy

  def objective(params, delayed, tokens, scale, param_transform=None):
    used = param_gather.gather(params) if fp8_param_gather else params
    if fp8_param_gather and param_transform is not None:  # the weights as gathered
      used, inner = params, param_transform
      param_transform = lambda tree, where: param_gather.gather(inner(tree, where))  # noqa: E731
    logits, aux = model.apply(used, tokens, policy, delayed=delayed,
                              param_transform=param_transform)
    lm = model.loss(logits, tokens)
    extra = aux.get("aux_loss", jnp.zeros((), lm.dtype))
    loss = lm + extra
    routing = aux.get("routing", {}) if with_routing else {}
    return loss if scale is None else loss * scale, (loss, lm, extra, routing)

  if param_specs is not None and mesh is None:
    raise ValueError("param_specs split the params over a mesh's devices: pass the mesh")
  if gather_dtype is not None and (param_specs is None or fp8_param_gather):
    raise ValueError("gather_dtype applies to FSDP's gathers (param_specs), and not with "
                     "fp8_param_gather, which quantizes the gathered float32 weights")
  gradients = _gradients(objective, mesh, replicas, reduce_per_layer, param_specs,
                         gather_dtype)

  def step(state: TrainState, tokens):
    scale = None if loss_scale is None else state.loss_scale["scale"]
    loss, lm, aux, routing, grads, delayed = gradients(state.params, state.delayed, tokens,
                                                       scale)
    grads = _float32(grads)  # no-op for float32 params
    if loss_scale is not None:
      grads = loss_scale.unscale(grads, state.loss_scale)
    grad_norm = layer_stack.global_norm(grads)  # summed in the per-layer order
    updates, opt_state = tx.update(grads, state.opt_state, _float32(state.params))
    params = optax.apply_updates(state.params, updates)  # rounds to the params' dtype
    # What the step reads (a finite gradient can still overflow its norm) and, with
    # check_update, what it would write (a finite update of a NaN optimizer state is not
    # finite). Without it the decision needs no pass over the new params, so that XLA
    # fuses the select below into the update itself.
    finite_groups = {"params": all_finite(state.params), "grads": all_finite(grads),
                     "grad_norm": jnp.isfinite(grad_norm)}
    if check_update:
      finite_groups["new_params"] = all_finite(params)
    finite = jnp.isfinite(loss) & jnp.all(jnp.stack(jax.tree.leaves(finite_groups)))
    keep = lambda new, old: jax.tree.map(  # noqa: E731
        lambda a, b: jnp.where(finite, a, b), new, old)
    metrics = {"loss": loss, "lm_loss": lm, "aux_loss": aux,
               "grad_norm": grad_norm, "finite": finite,
               "finite_groups": finite_groups}
    scale_state = state.loss_scale
    if loss_scale is not None:
      scale_state, absorbed = loss_scale.update(state.loss_scale, finite)
      metrics.update(loss_scale=scale_state["scale"], skipped_steps=scale_state["skipped"],
                     skipped=~finite & absorbed)
    if with_routing:
      metrics["routing"] = routing
    new_state = TrainState(state.step + finite.astype(jnp.int32), keep(params, state.params),
                           keep(opt_state, state.opt_state), keep(delayed, state.delayed),
                           scale_state)
    return new_state, metrics

  return step


def _gradients(objective, mesh, replicas, reduce_per_layer=False, param_specs=None,
               gather_dtype=None):
  """``(params, delayed, tokens, scale) -> (loss, lm, aux, routing, grads, delayed)``:
  the objective's values and its gradients with respect to the params and the amax
  histories (their update), over the global batch; with ``mesh``, per device and then
  combined (:mod:`fp8jax.train.data_parallel`), the gradients in the backward pass with
  ``reduce_per_layer``; ``param_specs``: the params split over the devices (FSDP)."""
  def local(params, delayed, tokens, scale, param_transform=None):
    (_, (loss, lm, aux, routing)), (grads, new_delayed) = jax.value_and_grad(
        objective, argnums=(0, 1), has_aux=True)(params, delayed, tokens, scale,
                                                 param_transform)
    return loss, lm, aux, routing, grads, new_delayed

  if mesh is None:
    return local

  if param_specs is not None:
    transform = dp.gather_in_forward(param_specs, gather_dtype)
  else:
    transform = dp.mean_in_backward if reduce_per_layer else None

  def combined(params, delayed, tokens, scale):
    loss, lm, aux, routing, grads, new_delayed = local(params, delayed, tokens, scale,
                                                       transform)
    if param_specs is not None:
      grads = dp.finish_gathered(grads, param_specs)
    elif not reduce_per_layer:
      grads = dp.mean(grads)
    rows, counts = dp.split_routing(routing)
    return (*dp.mean((loss, lm, aux)), rows, counts, grads, dp.maximum(new_delayed))

  split = dp.SAME if param_specs is None else param_specs
  run = dp.per_device(combined, mesh, in_specs=(split, dp.SAME, dp.ROWS, dp.SAME),
                      out_specs=(dp.SAME,) * 3 + (dp.ROWS, dp.SAME, split, dp.SAME),
                      replicas=replicas)

  def gradients(params, delayed, tokens, scale):
    loss, lm, aux, rows, counts, grads, new_delayed = run(params, delayed, tokens, scale)
    return loss, lm, aux, dp.merge_routing(rows, counts), grads, new_delayed
  return gradients


def all_finite(tree):
  """Per leaf of ``tree`` (params-like: params, gradients, optimizer moments), whether all
  its values are finite, named per layer (one pass over a stacked leaf:
  :func:`fp8jax.models.layer_stack.reduce_per_layer`)."""
  return layer_stack.reduce_per_layer(lambda x, axis: jnp.all(jnp.isfinite(x), axis=axis),
                                      tree)


def state_finite(state: TrainState) -> dict:
  """``finite_groups`` of a train state as it would be saved: its params
  (``new_params``) and optimizer state (``opt_state``), per leaf and layer."""
  return {"new_params": all_finite(state.params), "opt_state": all_finite(state.opt_state)}


def first_nonfinite(finite_groups) -> str | None:
  """"params/<path>" of the first non-finite parameter, else "grads/<path>" of the first
  non-finite gradient, else "grad_norm" (the gradients' norm overflowed), else
  "new_params/<path>" of the first parameter the update would make (or made) non-finite
  (a NaN or infinite optimizer state, a learning rate too large), else
  "opt_state/<path>", else None (host-side, from the step's ``finite_groups`` or
  :func:`state_finite`'s)."""
  for kind in ("params", "grads", "grad_norm", "new_params", "opt_state"):
    if kind not in finite_groups:
      continue
    for path, ok in jax.tree_util.tree_flatten_with_path(finite_groups[kind])[0]:
      if not bool(ok):
        keys = (str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        return "/".join((kind, *keys))
  return None
