"""The model a precision study compares: a small interface, so that the paired evaluator
(:mod:`fp8jax.study.comparison.paired`), the sweep
(:func:`fp8jax.study.comparison.sweep.evaluate`) and the report run on any model.

    model = fp8jax.models.registry.get("deepseek_moe:tiny")  # a model fp8jax ships
    model, params = model_api.nnx_model(my_nnx_model, classifier)  # any Flax NNX model
    ev = paired.PairedEvaluator(model, [Variant("fc_fp8", rules)], mesh)

A :class:`StudyModel` (:class:`fp8jax.models.api.Model`) says how to run the model under
a policy (``apply``), its loss, its reference policy (BF16), and how its parameter paths
group into modules, layers and experts (a :class:`fp8jax.metrics.paths.Classifier`).
Routing divergence and per-expert metrics appear when ``apply``'s aux carries a
``routing`` entry and the classifier marks expert stacks; a dense model has neither, and
its rows have no routing columns.

The branch-off runs (:mod:`fp8jax.study.branches.branch`) train DeepSeek-MoE only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import functools
from typing import Any

import jax
import jax.numpy as jnp

from fp8jax.metrics import paths as paths_lib
from fp8jax.models import api

StudyModel = api.Model
"""The study's name for :class:`fp8jax.models.api.Model`."""
Variant = api.Variant


next_token_loss = api.next_token_loss


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

  abstract = api.abstract_of(params)
  study = StudyModel(
      name=name or type(model).__name__, abstract_params=lambda: abstract, apply=apply,
      loss=loss, baseline=Variant("bf16", rules_lib.Rules([])), classifier=classifier,
      check=check,
      describe=api.variant_meta,
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
  abstract = api.abstract_of(params)
  label = name or type(module).__name__
  study = StudyModel(
      name=label, abstract_params=lambda: abstract, apply=apply, loss=loss,
      baseline=Variant("bf16", rules_lib.Rules([])), classifier=classifier, check=check,
      describe=api.variant_meta,
      meta=dict(meta or {"model": label}))
  return study, params
