"""Policies and site specs back to text: the inverse of :func:`~fp8jax.models.policy.parse_policy`.

    to_expression(parse_policy("moe@0-8:deepseek_v3+gemm:fp32_blockwise@1"))
    # "moe_out@0-8:deepseek_v3+gemm:fp32_blockwise@1"
    to_expression(fp8jax.preset("te_hybrid"))            # "te_hybrid"

Round trip: for every policy ``p`` the grammar expresses,
``parse_policy(to_expression(p))`` has ``p``'s rules, GEMM recipe, GEMM layers and BF16
tail, and is named by the expression itself (a policy's name is a label: the grid names
``attn_l0_e4m3``, ``fp8_tensor`` ... are not expressions). A policy named by its own
expression, as ``parse_policy`` names the policies it builds, comes back equal as a whole.
For a spec ``s``, ``parse_spec(to_expression(s)) == s``.

The canonical text:

* a site rule is ``SITE@LAYERS:SPEC`` with the full site name (``attn_out``), layer runs
  as ranges (``0-8``, ``1,3,5-7``, ``all``);
* a spec is ``FORMAT/GRANULARITY[/delayed(h=..,reduce=..,margin=..)]`` when that form
  gives it (granularity always written: ``e4m3/tensor``, ``e5m2/1x128``), else the name of
  the preset equal to it (``deepseek_v3``);
* a GEMM recipe is ``gemm:NAME[@LAYERS]``; a noise-matched control is ``noise(EXPR)``.

What the grammar cannot express (a custom :class:`fp8jax.GemmConfig`, a spec that is
neither a preset nor of the simple form, a BF16 tail other than the recipe's, a policy
whose specs are only partly noise controls) raises ValueError naming the part.
"""

from __future__ import annotations

import dataclasses

import fp8jax
from fp8jax.gemm import recipes
from fp8jax.models import policy as policy_lib
from fp8jax.numerics.formats import FORMATS
from fp8jax.numerics.presets import PRESETS


def layers_expression(layers: tuple[int, ...] | None) -> str:
  """None -> ``all``; (0, 1, 2, 5) -> ``0-2,5``; the inverse of ``parse_layers``."""
  if layers is None:
    return "all"
  runs: list[list[int]] = []
  for i in sorted(set(layers)):
    if runs and i == runs[-1][1] + 1:
      runs[-1][1] = i
    else:
      runs.append([i, i])
  return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _granularity_name(granularity) -> str | None:
  for name, make in policy_lib.GRANULARITIES.items():
    if make() == granularity:
      return name
  return None


def spec_expression(spec: fp8jax.QuantSpec) -> str:
  """The text ``parse_spec`` reads back as ``spec``; ValueError if there is none."""
  if not isinstance(spec, fp8jax.QuantSpec):
    raise TypeError(f"to_expression: expected a QuantSpec or PrecisionPolicy, got "
                    f"{type(spec).__name__} {spec!r}")
  gran = _granularity_name(spec.granularity)
  if gran is not None and spec.format in FORMATS:
    text = f"{spec.format}/{gran}"
    if spec.scaling == "delayed":
      text += (f"/delayed(h={spec.history_len},reduce={spec.history_reduce},"
               f"margin={spec.margin})")
    if _parses_to(text, spec):
      return text
  for name, preset in PRESETS.items():
    if preset == spec:
      return name
  raise ValueError(f"spec {spec.describe()} has no policy expression: it is no preset "
                   f"({', '.join(sorted(PRESETS))}) and not of the form "
                   f"FORMAT[/GRANULARITY][/{policy_lib.DELAYED_SYNTAX}] (granularities "
                   f"{', '.join(policy_lib.GRANULARITIES)}; FP32 scales, eps 1e-12, "
                   "round to nearest, straight-through backward)")


def _parses_to(text: str, spec: fp8jax.QuantSpec) -> bool:
  try:
    return policy_lib.parse_spec(text) == spec
  except ValueError:
    return False


def _gemm_expression(policy: policy_lib.PrecisionPolicy) -> str:
  same = [n for n, c in policy_lib.GEMMS.items() if c == policy.gemm]  # tails may differ
  name = next((n for n in same if recipes.BF16_TAIL.get(n, 0.0) == policy.gemm_bf16_tail),
              same[0] if same else None)
  if name is None:
    raise ValueError(f"policy {policy.name!r}: its GEMM config ({policy.gemm.describe()}) is "
                     f"none of the named recipes {sorted(policy_lib.GEMMS)}, so it has no "
                     "expression")
  tail = recipes.BF16_TAIL.get(name, 0.0)
  if policy.gemm_bf16_tail != tail:
    raise ValueError(f"policy {policy.name!r}: gemm_bf16_tail={policy.gemm_bf16_tail} differs "
                     f"from recipe {name!r}'s {tail}, which an expression implies")
  at = "" if policy.gemm_layers is None else "@" + layers_expression(policy.gemm_layers)
  return f"gemm:{name}{at}"


def _policy_expression(policy: policy_lib.PrecisionPolicy) -> str:
  if policy_lib.is_noise_control(policy):
    return f"noise({_policy_expression(policy_lib.control_base(policy))})"
  if policy.gemm is None and policy.gemm_layers is not None:
    raise ValueError(f"policy {policy.name!r}: gemm_layers without a GEMM recipe have no "
                     "expression")
  terms = []
  for rule in policy.rules:
    try:
      spec = spec_expression(rule.spec)
    except ValueError as e:
      raise ValueError(f"policy {policy.name!r}, site {rule.site}: {e}") from None
    terms.append(f"{rule.site}@{layers_expression(rule.layers)}:{spec}")
  if policy.gemm is not None:
    terms.append(_gemm_expression(policy))
  return "+".join(terms) or "bf16"


def same_numerics(a: policy_lib.PrecisionPolicy, b: policy_lib.PrecisionPolicy) -> bool:
  """Whether two policies quantize alike (equal but for their names)."""
  return dataclasses.replace(a, name="") == dataclasses.replace(b, name="")


def to_expression(obj: policy_lib.PrecisionPolicy | fp8jax.QuantSpec) -> str:
  """The canonical expression of a policy or a site spec (see the module docstring).

  Raises:
    ValueError: the grammar cannot express ``obj``; the message names the part.
    TypeError: ``obj`` is neither a PrecisionPolicy nor a QuantSpec.
  """
  if not isinstance(obj, policy_lib.PrecisionPolicy):
    return spec_expression(obj)
  text = _policy_expression(obj)
  if text == "bf16" and obj.gemm_bf16_tail:
    raise ValueError(f"policy {obj.name!r}: a BF16 tail without a GEMM recipe has no "
                     "expression")
  if not same_numerics(policy_lib.parse_policy(text), obj):
    raise ValueError(f"policy {obj.name!r} has no expression: {text!r} reads back as "
                     "another policy")
  return text
