"""The evaluation loss of a run, in the training precision or in BF16.

A run trained in a low-precision policy may be judged by its weights' BF16 forward, as
recipes that train in FP8 and evaluate in BF16 are: ``train.eval_precision``. On every
logged step, before the step updates the params, the step's batch also goes through a
forward pass alone, at those params, and its loss is logged:

- ``""`` (the default): no such forward; the run's loss is the training forward's
  (``loss``, ``lm_loss``), in the run's policy;
- ``"train"``: the forward in the run's policy (with ``precision.fp8_param_gather``, on
  the gathered weights, as the training forward);
- ``"bf16"``: the forward in the model's BF16 baseline (``Model.baseline``), the same
  master weights, while the run trains in its policy.

Columns: ``eval/loss`` (the objective, LM + balance loss) and ``eval/lm_loss``. A batch
is read before its update, so where every batch is seen once (the validation matrix's runs)
the loss is a held-out one. A BF16 run's ``"bf16"`` evaluation is its own policy's. The
validation matrix compares the evaluation columns when its runs have them
(:func:`column`; ``fp8jax.study.runs.validation``). The forward costs about a third of a
step per logged step, and its own compilation.
"""

from __future__ import annotations

import jax

from fp8jax.train import data_parallel as dp
from fp8jax.train import param_gather

PRECISIONS = ("", "train", "bf16")
"""``train.eval_precision``'s values: none, the run's policy, the model's BF16 baseline."""
PREFIX = "eval/"


def make_eval(model, policy, mesh=None, replicas: int | None = None, moe_groups: int = 1,
              fp8_param_gather: bool = False):
  """``eval(params, delayed, tokens int [B, S]) -> {"eval/loss", "eval/lm_loss"}``
  (float32 scalars; jit it): the forward of ``model`` (a
  :class:`fp8jax.models.api.Model`) in ``policy``, no gradient; ``delayed``: the policy's
  amax histories, read (``{}`` for a policy without delayed sites). ``mesh``: each device
  takes its own rows and the losses are averaged over them, as the training step does
  (:mod:`fp8jax.train.data_parallel`; ``replicas``: their number), or None: one program,
  ``moe_groups`` going to DeepSeek-MoE's ``apply``. ``fp8_param_gather``: the forward on
  the weights as the simulated FP8 gather gives them (:mod:`fp8jax.train.param_gather`)."""
  groups = {} if moe_groups == 1 else {"moe_groups": moe_groups}

  def local(params, delayed, tokens):
    used = param_gather.gather(params) if fp8_param_gather else params
    logits, aux = model.apply(used, tokens, policy, delayed=delayed, **groups)
    lm = model.loss(logits, tokens)
    return {PREFIX + "loss": lm + aux.get("aux_loss", 0.0), PREFIX + "lm_loss": lm}

  if mesh is None:
    return local
  return dp.per_device(lambda *args: dp.mean(local(*args)), mesh,
                       in_specs=(dp.SAME, dp.SAME, dp.ROWS), out_specs=dp.SAME,
                       replicas=replicas)


def is_logged(done: int, total: int, log_every: int) -> bool:
  """Whether the step that makes ``done`` updates is logged (every ``log_every``-th and
  the last), as the training loop logs."""
  return done % log_every == 0 or done == total


class Evaluated:
  """``step(state, tokens) -> (state, metrics)`` that, on every call whose step is logged
  (:func:`is_logged`, counted from step ``start``), first runs ``evaluate`` on the state's
  params and delayed histories and the same batch, and adds its scalars to the metrics."""

  def __init__(self, step_fn, evaluate, start: int, total: int, log_every: int):
    self.step_fn, self.evaluate, self.done = step_fn, evaluate, start
    self.total, self.log_every = total, log_every

  def __call__(self, state, tokens):
    self.done += 1
    extra = (self.evaluate(state.params, state.delayed, tokens)
             if is_logged(self.done, self.total, self.log_every) else {})
    state, metrics = self.step_fn(state, tokens)
    return state, {**metrics, **extra}


def policy_for(precision: str, model, policy):
  """The policy of the evaluation forward (None: none)."""
  return {"": None, "train": policy, "bf16": model.baseline}[precision]


def evaluator(cfg, model, policy, mesh=None, moe_groups: int = 1):
  """``evaluate(params, delayed, tokens)`` (:func:`make_eval`, not jitted) as the run config
  ``cfg`` asks (``train.eval_precision``) for the run's ``model`` and ``policy``, or None
  when it asks for none; ``mesh`` and ``moe_groups``: :func:`make_eval`'s."""
  precision = cfg.train.get("eval_precision", "")
  used = policy_for(precision, model, policy)
  if used is None:
    return None
  evaluate = make_eval(model, used, mesh=mesh, replicas=cfg.train.replicas or None,
                       moe_groups=moe_groups,
                       fp8_param_gather=precision == "train" and cfg.precision.fp8_param_gather)
  if precision == "bf16":  # the baseline has no delayed-scaled sites: no histories to read
    return lambda params, delayed, tokens: evaluate(params, {}, tokens)
  return evaluate


def wrap(step_fn, cfg, model, policy, mesh, start: int):
  """``step_fn`` evaluated as the run config ``cfg`` asks (``train.eval_precision``), on
  the devices of ``mesh`` as the step runs (per device, or partitioned by XLA with
  ``train.fsdp``)."""
  per_device = not cfg.train.fsdp
  evaluate = evaluator(cfg, model, policy, mesh=mesh if per_device else None,
                       moe_groups=1 if per_device else mesh.devices.size)
  if evaluate is None:
    return step_fn
  return Evaluated(step_fn, jax.jit(evaluate), start, cfg.train.steps, cfg.train.log_every)


def precision_of(config: dict) -> str:
  """The precision a run's loss was evaluated in: ``"bf16"`` or ``"train"`` (``config``:
  the run's config as a dict; an absent key is the default)."""
  return "bf16" if config.get("train", {}).get("eval_precision", "") == "bf16" else "train"


def column(metric: str, config: dict) -> str:
  """The metrics column that holds ``metric`` (``loss`` or ``lm_loss``) as the run with
  ``config`` evaluated it: ``eval/<metric>`` where it logged an evaluation, else
  ``metric`` (the training forward's)."""
  evaluated = config.get("train", {}).get("eval_precision", "") in ("train", "bf16")
  return PREFIX + metric if evaluated else metric
