"""Any Flax language model as a registered family, quantized by rules on the jaxpr route:
every binary (train, compare, branch, validate, report) on a model fp8jax did not write.

    flax_lm.register_nnx("my_lm", MyLM, classifier, vocab_size=320, max_len=128)
    model = registry.get("my_lm:tiny")                    # MyLM(rngs=...) at random init

    model = flax_lm.model("nano_moe:tiny", init=init, forward=forward,   # any forward
                          classifier=classifier, vocab_size=320, max_len=128)

``forward(params, tokens) -> logits`` (or ``(logits, aux)``) over a plain params pytree
is run under :func:`fp8jax.rules.quantize_gemms`, so a policy reaches every GEMM on a
parameter whatever code computes it: Flax layers, ``x @ self.w``, ``jnp.einsum``, a tied
head ``h @ embedding.T``. Policies are text in :mod:`fp8jax.models.rules_policy`'s grammar
(``gemm:mxfp8``, ``gemm:nvfp4_recipe``, ``gemm:none@REGEX``; the regex matches a
parameter's module path, its pytree path minus the leaf, e.g. ``blocks/0/fc``); output
rules need module boundaries and are refused. ``compute_dtype`` (default BF16) is the
precision the floating params are cast to in the forward (the params stay float32): the
BF16 baseline. A family that fp8jax does not ship is found by importing the module of
its name (:func:`fp8jax.models.registry.get`), so a file ``my_lm.py`` that calls
:func:`register_nnx` serves every binary run from its folder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import functools
from typing import Any

import jax
import jax.numpy as jnp

from fp8jax import rules as rules_lib
from fp8jax.metrics import paths as paths_lib
from fp8jax.models import api, registry, rules_policy

EXAMPLE_LEN = 16
"""Tokens per sequence of the example batch a policy is checked on."""


def cast_floats(params, dtype: str | None):
  """``params`` with its floating leaves cast to ``dtype`` (None: unchanged)."""
  if dtype is None:
    return params
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                      else x, params)


def model(name: str, *, init: Callable[[jax.Array], Any],
          forward: Callable[[Any, jax.Array], Any], classifier: paths_lib.Classifier,
          vocab_size: int, max_len: int, layer_path: str | None = None,
          compute_dtype: str | None = "bfloat16", meta: Mapping[str, Any] | None = None,
          config: Any = None,
          loss: Callable[[jax.Array, jax.Array], jax.Array] = api.next_token_loss
          ) -> api.Model:
  """A :class:`~fp8jax.models.api.Model` of a language model given as functions.

  Args:
    name: its name (``family:size``).
    init: ``rng -> params`` (a plain pytree: nested dicts of arrays).
    forward: ``(params, tokens int32 [B, S]) -> logits [B, S, V]`` or ``(logits, aux)``
      (``aux``: ``aux_loss``, ``routing``, as :class:`~fp8jax.models.api.Model` says).
    classifier: the grouping of its parameter paths (module, layer); the number of layers
      is the largest layer it finds plus one.
    vocab_size, max_len: the token ids it reads are below ``vocab_size``; sequences up to
      ``max_len``.
    layer_path: the regex of layer ``{i}``'s modules (e.g. ``"blocks/{i}/.*"``), for the
      recipes that keep their last layers in BF16 (None: such recipes are refused).
    compute_dtype: the floating params are cast to it in the forward (None: as stored).
    meta: its description (JSON values) for ``meta.json`` and ``run.json``.
    config: its own configuration (hashable), or None.
    loss: ``(logits, tokens) -> scalar``.
  """
  abstract = jax.eval_shape(init, jax.random.key(0))
  param_paths = tuple(paths_lib.flatten(abstract))
  layers = [classifier.layer_of(p) for p in param_paths]
  num_layers = max((i for i in layers if i is not None), default=-1) + 1
  example = jax.ShapeDtypeStruct((1, min(EXAMPLE_LEN, max_len or EXAMPLE_LEN)), jnp.int32)

  def run(params, tokens):
    out = forward(cast_floats(params, compute_dtype), tokens)
    logits, aux = out if isinstance(out, tuple) else (out, {})
    return logits.astype(jnp.float32), dict(aux)

  @functools.cache
  def quantized(rules):
    return rules_lib.quantize_gemms(run, rules) if len(rules) else run

  def apply(params, tokens, policy, *, delayed=None, telemetry=False, param_transform=None,
            **unused):
    del delayed, telemetry, unused  # no output rules on the jaxpr route: no histories
    return quantized(policy.rules)(api.transform_top_level(params, param_transform), tokens)

  def parse(text):
    return rules_policy.parse(text, num_layers, layer_path)

  def check(policy):
    if not isinstance(policy, api.Variant):
      raise TypeError(f"{name} takes a Variant (rules), got {type(policy).__name__}")
    if len(policy.rules):  # quantize_gemms raises on a rule that quantizes no GEMM
      jax.eval_shape(quantized(policy.rules), abstract, example)

  @functools.cache
  def direct(policy):
    if not len(policy.rules):
      return frozenset()
    sites, _ = rules_lib.quantize_gemms(run, policy.rules, strict=False).sites(abstract,
                                                                                example)
    weights = {site.weight for site, action in sites
               if action.config is not None and site.weight is not None}
    modules = {w.rpartition("/")[0] for w in weights} - {""}
    return frozenset((classifier.module_of(p), classifier.layer_of(p)) for p in param_paths
                     if p in weights or p.startswith(tuple(m + "/" for m in modules)))

  def describe(policy):
    return {**api.variant_meta(policy), "direct": sorted(direct(policy), key=str)}

  @functools.cache
  def flops_per_token(seq_len: int) -> float:
    """3 x the forward's FLOPs per token (XLA's cost analysis of one sequence)."""
    tokens = jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
    cost = jax.jit(run).lower(abstract, tokens).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return 3.0 * float((cost or {}).get("flops", 0.0)) / seq_len

  return api.Model(
      name=name, abstract_params=lambda: abstract, apply=apply, loss=loss,
      baseline=rules_policy.parse(rules_policy.BASELINE), classifier=classifier, init=init,
      vocab_size=vocab_size, max_len=max_len, flops_per_token=flops_per_token,
      parse_policy=parse, check=check, direct=direct, describe=describe,
      meta=dict(meta or {"model": name}), config=config)


def nnx_model(name: str, make: Callable[..., Any], classifier: paths_lib.Classifier, *,
              vocab_size: int, max_len: int, kwargs: Mapping[str, Any] | None = None,
              **options) -> api.Model:
  """:func:`model` of the Flax NNX module ``make(**kwargs, rngs=nnx.Rngs(rng))`` (its
  ``__call__(tokens) -> logits``); its params are its ``nnx.Param`` state as a plain dict.
  ``options``: those of :func:`model`."""
  from flax import nnx

  kwargs = dict(kwargs or {})
  build = lambda rng: make(**kwargs, rngs=nnx.Rngs(rng))
  graphdef, template, *rest = nnx.split(nnx.eval_shape(lambda: build(0)), nnx.Param, ...)
  if len(jax.tree.leaves(rest)):
    raise ValueError(f"{name}: the model holds state other than nnx.Param (RNG streams, "
                     "batch statistics); give its forward as a function (flax_lm.model)")

  def init(rng):
    return nnx.to_pure_dict(nnx.state(build(rng), nnx.Param))

  def forward(params, tokens):
    state = jax.tree.map(lambda x: x, template)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state, *rest)(tokens)

  meta = {"model": name, **{k: v for k, v in kwargs.items()
                            if isinstance(v, (bool, int, float, str))}}
  return model(name, init=init, forward=forward, classifier=classifier,
               vocab_size=vocab_size, max_len=max_len, meta=meta, **options)


def register_nnx(family: str, make: Callable[..., Any], classifier: paths_lib.Classifier, *,
                 vocab_size: int, max_len: int,
                 sizes: Mapping[str, Mapping[str, Any]] | None = None, **options) -> None:
  """Registers the NNX model class (or function) ``make`` as ``family``: size ``s`` is
  ``make(**sizes[s], **overrides, rngs=...)`` (default: one size, ``tiny``, of ``make``'s
  defaults); ``--config.model_overrides.KEY=...`` sets its keyword arguments. Other
  arguments: those of :func:`nnx_model`."""
  sizes = {k: dict(v) for k, v in (sizes or {"tiny": {}}).items()}

  def factory(size, overrides, opts):
    if opts:
      raise ValueError(f"the model family {family!r} has no options {sorted(opts)}")
    if size not in sizes:
      raise ValueError(f"unknown {family} size {size!r}; known: {sorted(sizes)}")
    return nnx_model(f"{family}:{size}", make, classifier, vocab_size=vocab_size,
                     max_len=max_len, kwargs={**sizes[size], **overrides}, **options)

  registry.register(family, factory, lambda: tuple(sizes))
