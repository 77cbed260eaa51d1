"""DeepSeek-MoE's precision policies as rules of the engine (:mod:`fp8jax.rules`).

The model's quantization decisions are answered by rules over paths:

* a **site** is a named point (:mod:`fp8jax.rules.points`) ``layers/{i}/{site}``
  (``layers/0/attn_out``, ``layers/2/moe_routed_out``, ...): a value inside a decoder
  layer, not a module, fake-quantized by an ``output`` rule;
* the **GEMM recipe** applies to the real module paths of the DeepSeek-V3 precision map's
  linear layers: ``layers/{i}/self_attn/{q,k,v,o}_proj``, ``layers/{i}/mlp/{gate,up,down}_proj``
  (dense layers), ``layers/{i}/mlp/shared_experts/{gate,up,down}_proj``, and the routed
  experts' grouped GEMM at the MoE module ``layers/{i}/mlp`` (``op="ragged_dot"``).

A policy compiles in its own order (later rules override earlier ones): one output rule
per site rule (``SITE@LAYERS:SPEC`` -> ``Rule("layers/(0|1)/SITE", SPEC)``), then the GEMM
rules on ``gemm_layers``, then ``None`` GEMM rules on the BF16 tail layers.
:class:`Decisions` is what the model asks while it traces.
"""

from __future__ import annotations

import dataclasses
import functools

from fp8jax.gemm import recipes
from fp8jax.gemm.dense import GemmConfig
from fp8jax.numerics.spec import QuantSpec
from fp8jax.rules import Rule, Rules, points

LINEAR_PATHS = r"self_attn/[qkvo]_proj|mlp/(shared_experts/)?(gate|up|down)_proj"
"""The linear layers of a decoder layer that a GEMM recipe routes (regex under
``layers/{i}/``); the routed experts are the ``ragged_dot`` of ``layers/{i}/mlp``."""
EXPERTS_PATH = "mlp"


def site_path(site: str, layer: int) -> str:
  """``layers/{layer}/{site}``: the named point of a quantization site."""
  return f"layers/{layer}/{site}"


def layers_regex(layers: tuple[int, ...] | None) -> str:
  """None (all) -> ``\\d+``; (0, 2) -> ``(0|2)``."""
  return r"\d+" if layers is None else "(" + "|".join(str(i) for i in layers) + ")"


@functools.lru_cache(maxsize=1024)
def site_rules(rules: tuple) -> Rules:
  """Output rules of the policy's site rules (``SiteRule(site, layers, spec)``)."""
  return Rules(Rule(f"layers/{layers_regex(r.layers)}/{r.site}", r.spec, role="output")
               for r in rules)


def gemm_rules(gemm: GemmConfig | None, gemm_layers: tuple[int, ...] | None,
               tail: int, num_layers: int) -> tuple[Rule, ...]:
  """The GEMM recipe's rules: ``gemm`` on ``gemm_layers`` (None: all), then the last
  ``tail`` of ``num_layers`` layers back in high precision."""
  if gemm is None:
    return ()
  at = layers_regex(gemm_layers)
  out = [Rule(f"layers/{at}/({LINEAR_PATHS})", gemm, op="dot_general"),
         Rule(f"layers/{at}/{EXPERTS_PATH}", gemm, op="ragged_dot")]
  if tail:
    bf16 = recipes.last_layers(tail, num_layers)
    out.append(Rule(f"layers/{layers_regex(bf16)}/.*", None, role="gemm"))
  return tuple(out)


@functools.lru_cache(maxsize=1024)
def policy_rules(policy, num_layers: int) -> Rules:
  """The :class:`~fp8jax.rules.Rules` of a ``PrecisionPolicy`` on a model of
  ``num_layers`` layers (cached: policies are hashable)."""
  return Rules((*site_rules(policy.rules), *gemm_rules(
      policy.gemm, policy.gemm_layers, policy.bf16_tail_layers(num_layers), num_layers)))


@dataclasses.dataclass(frozen=True)
class Decisions:
  """The quantization decisions of one policy on one model, from its rules."""

  rules: Rules

  def site(self, site: str, layer: int) -> QuantSpec | None:
    """The spec of ``site`` at ``layer`` (None: not quantized)."""
    return points.output_spec(self.rules, site_path(site, layer))

  def gemm(self, path: str, op: str = "dot_general") -> GemmConfig | None:
    """The GEMM config of the linear layer (or, ``op="ragged_dot"``, the routed experts)
    at the module path ``path`` (None: high precision)."""
    return points.gemm_config(self.rules, path, op)


def rules_of(policy, num_layers: int) -> Rules:
  """The rules of ``policy``: an :class:`fp8jax.models.api.Variant`'s own, a
  ``PrecisionPolicy``'s compiled (:func:`policy_rules`)."""
  return policy.rules if isinstance(policy.rules, Rules) else policy_rules(policy, num_layers)


def decisions(policy, num_layers: int) -> Decisions:
  """What the model asks while it traces under ``policy`` (a Variant or a
  ``PrecisionPolicy``: :func:`rules_of`)."""
  return Decisions(rules_of(policy, num_layers))


@dataclasses.dataclass(frozen=True)
class Gemms:
  """The GEMM configs of the linear layers under the module path ``prefix``, from the
  policy's rules (:class:`Decisions`)."""

  decisions: Decisions
  prefix: str

  def __call__(self, name: str = "", op: str = "dot_general") -> GemmConfig | None:
    """The config of ``prefix/name`` (``name`` empty: ``prefix`` itself)."""
    return self.decisions.gemm(f"{self.prefix}/{name}" if name else self.prefix, op)

  def child(self, name: str) -> Gemms:
    return Gemms(self.decisions, f"{self.prefix}/{name}")
