"""The model interface: what training, the comparison sweep, the branch-offs and the
report need of a model, whatever its architecture.

    model = fp8jax.models.registry.get("deepseek_moe:tiny")     # or "llama:tiny", ...
    params = model.init(jax.random.key(0))
    logits, aux = model.apply(params, tokens, model.baseline)
    loss = model.loss(logits, tokens) + aux.get("aux_loss", 0.0)

A :class:`Model` is a frozen record of functions over plain params pytrees (jit and grad
them directly). A policy is a :class:`Variant`: a name, :class:`fp8jax.rules.Rules` and
its record, for every model. Each model parses its own
``--policy`` text (``parse_policy``) and records a policy as JSON (``record``), which
checkpoints keep; its ``meta.json`` entry (``describe``) carries the policy's record
(:mod:`fp8jax.models.policy_record`), which checkpoints and the report read.

Optional parts have defaults that mean "the model has none": no delayed-scaling state,
no layers stored stacked (``layer_runs`` None), no directly quantized modules, no routing
(``apply``'s aux carries a ``routing`` entry when the model has a router; the classifier
marks expert stacks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from fp8jax.metrics import paths as paths_lib
from fp8jax.models import policy_record


@dataclasses.dataclass(frozen=True)
class Variant:
  """A named precision variant of a model quantized by rules: ``rules`` is an
  :class:`fp8jax.rules.Rules` (static, hashable); ``expr`` its text for the report;
  ``record`` its policy record (:mod:`fp8jax.models.policy_record`) where its text gave
  one (None: built from the rules; not part of equality or hash); ``control_of`` the
  name of the policy whose noise-matched control it is (None: not a control);
  ``source`` the parse tree of the text a model's own grammar read it from (e.g.
  DeepSeek-MoE's :class:`fp8jax.models.policy.PrecisionPolicy`, which its checkpoints
  record), None: none (not part of equality or hash)."""
  name: str
  rules: Any
  expr: str = ""
  record: dict | None = dataclasses.field(default=None, compare=False, repr=False)
  control_of: str | None = None
  source: Any = dataclasses.field(default=None, compare=False, repr=False)


def _no_direct(policy) -> frozenset:
  del policy
  return frozenset()


def _no_check(policy) -> None:
  del policy


def _no_state(policy) -> dict:
  del policy
  return {}


def _same(params):
  return params


def _no_init(rng):
  raise ValueError("this model was built from params in memory and has no random init; "
                   "pass its params")


def _no_flops(seq_len: int) -> float:
  del seq_len
  return 0.0


def rules_record(policy, expression: str | None = None) -> dict:
  """The JSON record of a :class:`Variant` (its rules as text: the rules engine has no
  JSON form yet)."""
  expr = getattr(policy, "expr", "") or ""
  return {"expression": (expression or expr or policy.name).strip(), "name": policy.name,
          "kind": "rules", "rules": [repr(r) for r in getattr(policy, "rules", ())]}


def variant_meta(variant) -> dict:
  """The ``meta.json`` entry of a :class:`Variant`: its expression, else a rule count
  (never a long ``repr``), its kind (``"policy"``, or ``"control"`` with ``control_of``)
  and its policy ``record`` (:mod:`fp8jax.models.policy_record`:
  the one its text gave, else :func:`~fp8jax.models.policy_record.of_rules`)."""
  rules = getattr(variant, "rules", ())
  expr = variant.expr or (f"{len(rules)} rule(s)" if len(rules) else "bf16 (no rules)")
  record = getattr(variant, "record", None) or policy_record.of_rules(
      variant.name, rules, variant.expr or None)
  control_of = getattr(variant, "control_of", None)
  kind = {"kind": "policy"} if control_of is None else {"kind": "control",
                                                        "control_of": control_of}
  return {"expr": expr, "direct": [], **kind, "record": record}


@dataclasses.dataclass(frozen=True)
class Model:
  """What the library needs of a model.

  Attributes:
    name: its name (registry name where it has one, e.g. ``"deepseek_moe:2b"``).
    abstract_params: () -> the params pytree of ``jax.ShapeDtypeStruct`` (per layer).
    apply: ``(params, tokens, policy, *, delayed=None, telemetry=False,
      param_transform=None, **options) -> (logits, aux)``; ``tokens`` int32 [B, S] (or a
      batch pytree, for a model with its own ``loss``). ``aux`` may hold ``aux_loss`` (a
      scalar added to the objective), ``routing`` (``{layer: {"topk_ids",
      "expert_counts", ...}}``: the router's choices, ``topk_ids`` int [B, S, k] and
      ``expert_counts`` int [E] per MoE layer, optionally ``topk_weights`` [B, S, k];
      routing divergence and, with a classifier that marks expert stacks, per-expert
      metrics come from them) and ``gemm_telemetry``.
      ``param_transform(tree, where)`` is applied to each part of the params where it is
      used (data-parallel gradient averaging, FSDP gathers;
      :mod:`fp8jax.train.data_parallel`); a model without layers of its own applies it to
      each top-level entry of the params where its forward starts
      (:func:`transform_top_level`). Other keywords are the model's own options (e.g.
      DeepSeek-MoE's ``moe_impl``); a model ignores those it does not have.
    loss: ``(logits, tokens) -> scalar`` (e.g. next-token cross-entropy).
    baseline: the reference policy (no quantization: the model computes in its own
      precision, e.g. BF16).
    classifier: the grouping of the parameter paths (module, layer, experts).
    init: ``rng -> params`` (per layer), random (a model built around params in memory
      raises).
    vocab_size: the token ids it reads are below this (0: it reads no token ids).
    max_len: the longest sequence (0: any).
    flops_per_token: ``seq_len -> training model FLOPs per token`` (forward + backward;
      0.0: unknown, then no MFU is reported).
    parse_policy: the ``--policy`` text -> a policy (ValueError on an unknown one).
    record: ``(policy, text) -> dict``: the policy as JSON, kept by checkpoints.
    direct: policy -> ``(module, layer)`` pairs it quantizes directly (the ``direct``
      metrics; empty: none).
    check: policy -> None; raises on a policy that does not fit the model.
    delayed_init: policy -> its empty amax histories (``{}``: no delayed scaling).
    describe: policy -> its ``meta.json`` entry (``expr``, ``direct``, ``kind``,
      ``record``: :mod:`fp8jax.models.policy_record`).
    meta: the model's description (JSON values), for ``meta.json`` and ``run.json``.
    layer_runs: policy -> the runs of alike layers its params may be stored stacked in
      (:mod:`fp8jax.models.layer_stack`), or None: the model stores no layers stacked.
    store: params -> the params in the layout ``apply`` computes on (stacked per run
      where the model scans its layers); gradients and metrics stay per layer.
    param_transform: whether ``apply`` applies ``param_transform`` per layer (so the
      data-parallel replicas may average each layer's gradients in the backward pass).
    config: the model's own configuration (hashable; e.g. DeepSeek-MoE's
      :class:`~fp8jax.models.config.ModelConfig`), or None.
    sites: the modules of a rules model's site grid, ``{module: its path in layer
      "{i}"}`` (e.g. ``{"attn": "layers/{i}/attn", "mlp": "layers/{i}/mlp"}``;
      :func:`fp8jax.models.rules_policy.site_grid`); empty: none.

  The precision of the reference (``baseline``) is read from the model itself
  (:meth:`reference_precision`), never from a name.
  """
  name: str
  abstract_params: Callable[[], Any]
  apply: Callable[..., tuple[jax.Array, Mapping[str, Any]]]
  loss: Callable[[jax.Array, jax.Array], jax.Array]
  baseline: Any
  classifier: paths_lib.Classifier
  init: Callable[[jax.Array], Any] = _no_init
  vocab_size: int = 0
  max_len: int = 0
  flops_per_token: Callable[[int], float] = _no_flops
  parse_policy: Callable[[str], Any] | None = None
  record: Callable[..., dict] = rules_record
  direct: Callable[[Any], frozenset] = _no_direct
  check: Callable[[Any], None] = _no_check
  delayed_init: Callable[[Any], Any] = _no_state
  describe: Callable[[Any], dict] | None = None
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  layer_runs: Callable[[Any], list[list[int]]] | None = None
  store: Callable[[Any], Any] = _same
  param_transform: bool = False
  config: Any = None
  sites: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def policy_meta(self, policy) -> dict:
    """The ``meta.json`` entry of ``policy``."""
    if self.describe is not None:
      return self.describe(policy)
    return variant_meta(policy) if isinstance(policy, Variant) else {
        "expr": str(getattr(policy, "expr", policy)), "direct": sorted(self.direct(policy)),
        "kind": "policy"}

  def policy_record(self, policy) -> dict | None:
    """The policy record of ``policy`` (its ``meta.json`` entry's ``record``; None for a
    model whose entries have none)."""
    return self.policy_meta(policy).get("record")

  def reference_precision(self, batch) -> dict:
    """What the reference (``baseline``) computes in on ``batch`` (arrays or
    ``jax.ShapeDtypeStruct`` s, e.g. int32 tokens [B, S]), from an abstract trace of
    ``apply`` (nothing runs): ``{"precision": "bf16" | "fp32" | ..., "gemm_share":
    {precision: share of the GEMM multiply-adds}}``; ``precision`` is the one of most
    multiply-adds, else (no floating GEMM) the commonest floating dtype of the params
    ("n/a": neither)."""
    params = self.abstract_params()
    share = gemm_precisions(lambda p, b: self.apply(self.store(p), b, self.baseline)[0],
                            params, abstract_of(batch))
    sizes: dict[str, int] = {}
    for x in jax.tree.leaves(params):
      if jnp.issubdtype(x.dtype, jnp.floating):
        name = precision_name(x.dtype)
        sizes[name] = sizes.get(name, 0) + x.size
    most = max(share or sizes, key=(share or sizes).get, default="n/a")
    return {"precision": most, "gemm_share": share}

  def policy(self, text: str):
    """The policy of the ``--policy`` text ``text`` (checked against the model)."""
    if self.parse_policy is None:
      raise ValueError(f"the model {self.name!r} takes its policies as objects, not text")
    policy = self.parse_policy(text)
    self.check(policy)
    return policy


def precision_name(dtype) -> str:
  """The short name of a floating dtype: ``"bf16"``, ``"fp32"``, ``"fp16"``, ``"fp64"``
  (others: numpy's name, e.g. ``"float8_e4m3fn"``)."""
  name = jnp.dtype(dtype).name
  return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
          "float64": "fp64"}.get(name, name)


def _equations(jaxpr, times: int = 1):
  """``(equation, times it runs)`` of every equation of a jaxpr and of the jaxprs its
  equations hold (scan bodies times their length; pjit, custom VJPs, cond branches and
  loop bodies once)."""
  for eqn in jaxpr.eqns:
    yield eqn, times
    inner_times = times * (eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1)
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _equations(inner, inner_times)


def gemm_precisions(fn: Callable[..., Any], *args) -> dict[str, float]:
  """``{precision: share}`` of the multiply-adds of the floating GEMMs (``dot_general``,
  ``ragged_dot_general``) of ``fn(*args)``, by the promoted dtype of their operands
  (:func:`precision_name`), largest share first, from an abstract trace (``args`` may be
  ``jax.ShapeDtypeStruct`` s); {} when it has none."""
  macs: dict[str, float] = {}
  for eqn, times in _equations(jax.make_jaxpr(fn)(*args).jaxpr):
    if eqn.primitive.name not in ("dot_general", "ragged_dot_general"):
      continue
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
      continue
    dims = eqn.params.get("dimension_numbers") or getattr(
        eqn.params.get("ragged_dot_dimension_numbers"), "dot_dimension_numbers", None)
    k = math.prod(lhs.shape[i] for i in dims[0][0]) if dims else lhs.shape[-1]
    name = precision_name(dtype)
    macs[name] = macs.get(name, 0.0) + float(eqn.outvars[0].aval.size) * k * times
  total = sum(macs.values())
  return {n: round(v / total, 6) for n, v in sorted(macs.items(), key=lambda kv: -kv[1])}


def direct_pairs(quantized: Iterable[str], param_paths: Iterable[str],
                 classifier: paths_lib.Classifier) -> frozenset:
  """The ``(module, layer)`` pairs (as ``classifier`` names them) of the parameters under
  the module paths ``quantized``: what a policy quantizes directly."""
  prefixes = tuple(q + "/" for q in quantized)
  return frozenset((classifier.module_of(p), classifier.layer_of(p))
                   for p in param_paths if p.startswith(prefixes))


def transform_top_level(params, param_transform):
  """``params`` with ``param_transform(entry, key)`` applied to each top-level entry (the
  identity for None): how a model without layers of its own applies
  :class:`Model`'s ``param_transform``."""
  if param_transform is None:
    return params
  return {k: param_transform(v, k) for k, v in params.items()}


def next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  """Mean cross-entropy of ``logits`` [B, S, V] predicting ``tokens`` [B, S] shifted by
  one (float32 scalar)."""
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  target = tokens[:, 1:]
  return -jnp.mean(jnp.take_along_axis(logp, target[..., None], axis=-1))


def abstract_of(params):
  """The ``jax.ShapeDtypeStruct`` tree of ``params``."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
                      params)
