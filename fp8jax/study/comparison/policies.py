"""The policies of a sweep: grids and expressions expanded, and their ``meta.json`` records.

    expand_policies(["seed", "noise(formats)"], num_layers=9)   # 8 + 6 policies
    expression(policy)                                           # "attn_out@0-8:e4m3/tensor"
"""

from __future__ import annotations

import dataclasses

from fp8jax import metrics
from fp8jax.models import policy as policy_lib
from fp8jax.models import policy_expression


def expand_policies(specs, num_layers: int) -> list[policy_lib.PrecisionPolicy]:
  """Policies from names/expressions; a grid name of :data:`fp8jax.models.policy.GRIDS`
  (e.g. ``"seed"``, the seed study's grid) expands to that grid at the model's depth, and
  ``noise(GRID)`` to the noise-matched control of each of its policies
  (``noise(fp8_blockwise)``, ...: :func:`fp8jax.models.policy.noise_policy`)."""
  out = []
  for spec in specs:
    spec = spec.strip()
    inner = spec[len("noise("):-1] if spec.startswith("noise(") and spec.endswith(")") else ""
    grid = policy_lib.GRIDS.get(inner or spec)
    if grid is None:
      out.append(policy_lib.parse_policy(spec))
      continue
    for name, expr in grid(num_layers).items():
      pol = dataclasses.replace(policy_lib.parse_policy(expr), name=name)
      out.append(policy_lib.noise_policy(pol) if inner else pol)
  if not out:
    raise ValueError("no policies to compare")
  return out


def policy_meta(policy: policy_lib.PrecisionPolicy, num_layers: int) -> dict:
  """A policy's ``meta.json`` entry: its expression, directly quantized modules and kind
  (``"policy"``, or ``"control"`` with ``control_of``, the name of the policy it controls)."""
  entry = {"expr": expression(policy),
           "direct": sorted(metrics.direct_modules(policy, num_layers)), "kind": "policy"}
  if policy_lib.is_noise_control(policy):
    entry.update(kind="control", control_of=policy_lib.control_base(policy).name)
  return entry


def expression(policy: policy_lib.PrecisionPolicy) -> str:
  """The policy's canonical expression, which ``parse_policy`` reads back as the same
  rules and GEMM recipe (:func:`fp8jax.models.policy_expression.to_expression`)."""
  return policy_expression.to_expression(policy)
