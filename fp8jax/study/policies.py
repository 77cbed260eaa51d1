"""The policies of a sweep: grids and expressions expanded, and their ``meta.json`` records.

    expand_policies(["seed", "noise(formats)"], num_layers=9)   # 8 + 6 policies
    expression(policy)                                           # "attn_out@0:e4m3/tensor"
"""

from __future__ import annotations

import dataclasses

from fp8jax import metrics
from fp8jax.models import policy as policy_lib


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
  """The site rules of a policy as an expression (``site@layers:format``; a noise-matched
  control as ``noise(...)`` of its policy's expression)."""
  if policy_lib.is_noise_control(policy):
    return f"noise({expression(policy_lib.control_base(policy))})"
  terms = [f"{r.site}@{'all' if r.layers is None else ','.join(map(str, r.layers))}:"
           f"{r.spec.format}/{r.spec.granularity.kind}{_delayed_suffix(r.spec)}"
           for r in policy.rules]
  if policy.gemm is not None:
    name = next((n for n, c in policy_lib.GEMMS.items() if c == policy.gemm), "custom")
    layers = "" if policy.gemm_layers is None else "@" + ",".join(map(str, policy.gemm_layers))
    terms.append(f"gemm:{name}{layers}")
  return "+".join(terms) or "bf16"


def _delayed_suffix(spec) -> str:
  """``/delayed(h=..,reduce=..,margin=..)`` of a delayed-scaled forward spec, else ""."""
  if spec.scaling != "delayed":
    return ""
  return f"/delayed(h={spec.history_len},reduce={spec.history_reduce},margin={spec.margin})"
