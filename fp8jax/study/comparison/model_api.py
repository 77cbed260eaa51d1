"""The model a precision study compares: a small interface, so that the paired evaluator
(:mod:`fp8jax.study.comparison.paired`), the sweep
(:func:`fp8jax.study.comparison.sweep.evaluate`) and the report run on any model.

    model = model_api.deepseek(cfg)                         # the DeepSeek-MoE it ships
    model = model_api.nnx_model(my_nnx_model, classifier)   # any Flax NNX model
    ev = paired.PairedEvaluator(model, [Variant("fc_fp8", rules)], mesh)

A :class:`StudyModel` says how to run the model under a policy (``apply``), its loss,
its reference policy (BF16), and how its parameter paths group into modules, layers and
experts (a :class:`fp8jax.metrics.paths.Classifier`). Routing divergence and per-expert
metrics appear when ``apply``'s aux carries a ``routing`` entry and the classifier marks
expert stacks; a dense model has neither, and its rows have no routing columns.

The branch-off runs (:mod:`fp8jax.study.branches.branch`) train DeepSeek-MoE only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from fp8jax.metrics import paths as paths_lib


def _no_direct(policy) -> frozenset:
  del policy
  return frozenset()


def _no_check(policy) -> None:
  del policy


def _no_state(policy) -> dict:
  del policy
  return {}


@dataclasses.dataclass(frozen=True)
class StudyModel:
  """What the study needs of a model.

  Attributes:
    name: a short name (recorded in ``meta.json``).
    abstract_params: () -> the params pytree of ``jax.ShapeDtypeStruct``.
    apply: ``(params, tokens, policy, *, delayed, moe_groups, telemetry, deterministic)
      -> (logits, aux)``; ``tokens`` int32 [B, S]. ``aux`` may hold ``aux_loss`` (a scalar
      added to the objective), ``routing`` (``{layer: {"topk_ids", "expert_counts",
      ...}}``: the MoE metrics) and ``gemm_telemetry``. Only DeepSeek-MoE uses the keyword
      options; others take and ignore them.
    loss: ``(logits, tokens) -> scalar`` (e.g. next-token cross-entropy).
    baseline: the reference policy (BF16, no quantization).
    classifier: the grouping of the parameter paths.
    direct: policy -> ``(module, layer)`` pairs it quantizes directly (the ``direct``
      metrics; empty: none).
    check: policy -> None; raises on a policy that does not fit the model.
    delayed_init: policy -> its empty amax histories (``{}``: no delayed scaling).
    describe: policy -> its ``meta.json`` entry (``expr``, ``direct``, ``kind``).
    meta: the model's description for ``meta.json`` (JSON values).
    store: params -> the params in the layout the model computes on (DeepSeek-MoE with
      ``scan_layers``: stacked per run of alike layers, :mod:`fp8jax.models.layer_stack`;
      arrays or ``jax.ShapeDtypeStruct``); gradients and metrics stay per layer.
    param_transform: whether ``apply`` also takes ``param_transform=fn``, applied to each
      part of the params where it is used (:func:`fp8jax.models.deepseek_moe.apply`): the
      data-parallel replicas then average each layer's gradients in the backward pass
      (``dataclasses.replace(model, param_transform=True)``; off in :func:`deepseek`: on
      4 H200s it was no faster).
  """
  name: str
  abstract_params: Callable[[], Any]
  apply: Callable[..., tuple[jax.Array, Mapping[str, Any]]]
  loss: Callable[[jax.Array, jax.Array], jax.Array]
  baseline: Any
  classifier: paths_lib.Classifier
  direct: Callable[[Any], frozenset] = _no_direct
  check: Callable[[Any], None] = _no_check
  delayed_init: Callable[[Any], Any] = _no_state
  describe: Callable[[Any], dict] | None = None
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  store: Callable[[Any], Any] = lambda params: params
  param_transform: bool = False

  def policy_meta(self, policy) -> dict:
    """The ``meta.json`` entry of ``policy``."""
    if self.describe is not None:
      return self.describe(policy)
    return {"expr": str(getattr(policy, "expr", policy)),
            "direct": sorted(self.direct(policy)), "kind": "policy"}


@dataclasses.dataclass(frozen=True)
class Variant:
  """A named precision variant of a model that is quantized by rules: ``rules`` is an
  :class:`fp8jax.rules.Rules` (static, hashable); ``expr`` its text for the report."""
  name: str
  rules: Any
  expr: str = ""


def deepseek(cfg, scan_layers: bool = False) -> StudyModel:
  """DeepSeek-MoE (:mod:`fp8jax.models.deepseek_moe`) under a
  :class:`~fp8jax.models.policy.PrecisionPolicy`: its LM + balance loss, routing and
  expert grouping (:data:`fp8jax.models.param_paths.DEEPSEEK`). ``scan_layers``: alike
  consecutive layers as one ``lax.scan`` (:mod:`fp8jax.models.layer_scan`), the params
  stored stacked per run of the BF16 baseline's alike layers (``store``)."""
  from fp8jax.models import deepseek_moe, delayed_sites, layer_stack, param_paths
  from fp8jax.models import policy as policy_lib
  from fp8jax.study.comparison import policies as policies_lib

  def apply(params, tokens, policy, *, delayed=None, moe_groups=1, moe_impl="dispatch",
            telemetry=False, deterministic=False, param_transform=None):
    return deepseek_moe.apply(params, tokens, cfg, policy, moe_impl=moe_impl,
                              moe_groups=moe_groups, delayed_state=delayed,
                              gemm_telemetry=telemetry and policy.gemm is not None,
                              deterministic=deterministic, scan_layers=scan_layers,
                              param_transform=param_transform)

  return StudyModel(
      name="deepseek_moe", abstract_params=lambda: deepseek_moe.abstract_params(cfg),
      apply=apply, loss=deepseek_moe.lm_loss, baseline=policy_lib.BF16,
      classifier=param_paths.DEEPSEEK,
      direct=lambda p: param_paths.direct_modules(p, cfg.num_hidden_layers),
      check=lambda p: p.check_layers(cfg.num_hidden_layers, cfg.is_moe_layer),
      delayed_init=lambda p: delayed_sites.init(cfg, p),
      describe=lambda p: policies_lib.policy_meta(p, cfg.num_hidden_layers),
      meta=dataclasses.asdict(cfg),
      store=(lambda p: layer_stack.stack(p, deepseek_moe.layer_runs(cfg, policy_lib.BF16)))
      if scan_layers else (lambda p: p))


def next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  """Mean cross-entropy of ``logits`` [B, S, V] predicting ``tokens`` [B, S] shifted by
  one (float32 scalar)."""
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  target = tokens[:, 1:]
  return -jnp.mean(jnp.take_along_axis(logp, target[..., None], axis=-1))


def label_loss(logits: jax.Array, batch: Mapping[str, Any]) -> jax.Array:
  """Mean cross-entropy of class ``logits`` [B, C] against ``batch["labels"]`` [B] (int;
  float32 scalar): the loss of a classifier's batches ``{"labels": ..., ...}``."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, batch["labels"][:, None], axis=-1))


def nnx_model(model, classifier: paths_lib.Classifier, name: str = "",
              loss: Callable[[jax.Array, jax.Array], jax.Array] = next_token_loss,
              call: Callable[[Any, jax.Array], jax.Array] | None = None,
              meta: Mapping[str, Any] | None = None) -> tuple[StudyModel, dict]:
  """A Flax NNX model, quantized by :class:`Variant` rules (:func:`fp8jax.rules.quantize_model`,
  no edit to its code), as a :class:`StudyModel`, and its params (a plain nested dict of
  its ``nnx.Param`` values).

  Args:
    model: the NNX module (its other state, e.g. RNG counts or batch stats, stays fixed).
    classifier: the grouping of its parameter paths (``nnx.Param`` paths, "/"-joined).
    name: the model's name (default: its class name).
    loss: ``(logits, tokens) -> scalar``.
    call: ``(module, tokens) -> logits`` (default: ``module(tokens)``).
    meta: its description for ``meta.json``.
  """
  from flax import nnx

  from fp8jax import rules as rules_lib

  graphdef, params_state, rest = nnx.split(model, nnx.Param, ...)
  params = nnx.to_pure_dict(params_state)
  call = call or (lambda module, tokens: module(tokens))

  @functools.cache
  def graph(rules):
    if rules is None or not len(rules):
      return graphdef
    return nnx.split(rules_lib.quantize_model(model, rules), nnx.Param, ...)[0]

  def apply(params, tokens, variant, **unused):
    del unused
    state = jax.tree.map(lambda x: x, params_state)  # a copy of the template
    nnx.replace_by_pure_dict(state, params)
    module = nnx.merge(graph(getattr(variant, "rules", variant)), state, rest)
    return call(module, tokens), {}

  def check(variant):
    graph(variant.rules)  # quantize_model raises on a rule that matches nothing

  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
                          params)
  study = StudyModel(
      name=name or type(model).__name__, abstract_params=lambda: abstract, apply=apply,
      loss=loss, baseline=Variant("bf16", rules_lib.Rules([])), classifier=classifier,
      check=check,
      describe=lambda v: {"expr": v.expr or repr(v.rules), "direct": [], "kind": "policy"},
      meta=dict(meta or {"model": name or type(model).__name__}))
  return study, params


def linen_model(module, variables: Mapping[str, Any], classifier: paths_lib.Classifier,
                example, name: str = "",
                loss: Callable[[jax.Array, jax.Array], jax.Array] = next_token_loss,
                meta: Mapping[str, Any] | None = None) -> tuple[StudyModel, dict]:
  """A Flax Linen model, quantized by :class:`Variant` rules while it runs
  (:func:`fp8jax.rules.intercept`, no edit to its code), as a :class:`StudyModel`, and its
  params (``variables["params"]``; the other collections stay fixed).

  Args:
    module: the Linen module (``module.apply(variables, batch) -> logits``).
    variables: its variables, e.g. ``module.init(key, example)``.
    classifier: the grouping of its parameter paths.
    example: an example batch; a variant whose rule matches no module of the model is
      refused on it (:func:`fp8jax.rules.check_linen`).
    name, loss, meta: as for :func:`nnx_model`.
  """
  from fp8jax import rules as rules_lib

  rest = {k: v for k, v in variables.items() if k != "params"}

  def apply(params, tokens, variant, **unused):
    del unused
    with rules_lib.intercept(getattr(variant, "rules", variant)):
      return module.apply({"params": params, **rest}, tokens), {}

  def check(variant):
    if len(variant.rules):
      rules_lib.check_linen(module, variant.rules, example)

  params = variables["params"]
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
                          params)
  label = name or type(module).__name__
  study = StudyModel(
      name=label, abstract_params=lambda: abstract, apply=apply, loss=loss,
      baseline=Variant("bf16", rules_lib.Rules([])), classifier=classifier, check=check,
      describe=lambda v: {"expr": v.expr or repr(v.rules), "direct": [], "kind": "policy"},
      meta=dict(meta or {"model": label}))
  return study, params
