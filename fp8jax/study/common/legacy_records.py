"""The one fallback for sweep folders written before ``meta.json`` entries had a policy
record: :func:`legacy_record` rebuilds an entry's record from its expression (else its
name) by parsing it as a policy, never by a pattern over names.

``meta.json`` entries carry ``record`` (:mod:`fp8jax.models.policy_record`) since it
existed; before that, an entry had ``expr`` (and, for a while, the site-grid ``cell``).
:meth:`fp8jax.study.common.results.Results.record` reads ``record`` where it is and calls
:func:`legacy_record` where it is not.
"""

from __future__ import annotations

import json

from fp8jax.models import deepseek_model, policy_record, rules_policy
from fp8jax.models import policy as policy_lib

DEEPSEEK, RULES = "deepseek_moe", "rules"
"""The policy grammars an old entry may be written in: DeepSeek-MoE's expressions
(:func:`fp8jax.models.policy.parse_policy`, site-grid names included) and the rules
policies' text (:func:`fp8jax.models.rules_policy.parse`)."""


def grammars(model: dict | None) -> tuple[str, ...]:
  """The grammars to read an old folder's entries in, from its ``meta["model"]``: a
  DeepSeek-MoE config (``num_hidden_layers``) reads DeepSeek-MoE's, another model's the
  rules text, a folder with no model description either."""
  model = model or {}
  if "num_hidden_layers" in model:
    return (DEEPSEEK,)
  return (RULES,) if model else (DEEPSEEK, RULES)


def _parse(grammar: str, text: str, num_layers: int | None) -> dict | None:
  """The record of ``text`` in ``grammar``, or None where it does not parse there."""
  try:
    if grammar == DEEPSEEK:
      return deepseek_model.policy_record(policy_lib.parse_policy(text), num_layers)
    record = rules_policy.parse(text, num_layers or 1, "{i}").record
  except ValueError:
    return None
  if not num_layers and record["gemm"] is not None:
    record["gemm"]["bf16_layers"] = None  # the depth is not known
  return record


def _meaning(record: dict) -> str:
  """What a record says is quantized, where two grammars can differ: its GEMM recipe on
  which layers or modules (``.*``: all, as DeepSeek-MoE's None) and its sites."""
  gemm = record["gemm"]
  if gemm is not None:
    gemm = {**gemm, "bf16_layers": None, "where": None if gemm["where"] == ".*" else gemm["where"]}
  return json.dumps([gemm, record["sites"]], sort_keys=True)


def legacy_record(name: str, entry: dict, model: dict | None = None) -> dict:
  """The policy record of the ``meta.json`` entry ``entry`` of policy ``name``, written
  before entries had one; ``model``: the folder's ``meta["model"]``.

  Its expression (``expr``) is read in the folder's grammars (:func:`grammars`), else, in
  DeepSeek-MoE's, its name (a site-grid cell's name: ``moe_l0-8_e5m2``); an entry that
  recorded its ``cell`` keeps it. An entry none of these parse (the floor, a rule count)
  gets a record without sites, GEMM or cell: the report lists it and no question uses it.

  Raises:
    ValueError: the expression parses in both grammars to different records (a folder
      that does not say its model): ambiguous, refused by the policy's name.
  """
  model = model or {}
  depth = model.get("num_hidden_layers") or model.get("num_layers")
  expr = str(entry.get("expr") or "").strip()
  found = {g: r for g in grammars(model) if expr and (r := _parse(g, expr, depth))}
  if len({_meaning(r) for r in found.values()}) > 1:
    raise ValueError(f"meta.json policy {name!r}: its expression {expr!r} reads differently "
                     "as a DeepSeek-MoE policy and as rules text, and the folder does not say "
                     "its model; rewrite the entry with its record")
  record = next(iter(found.values()), None)
  if record is None and DEEPSEEK in grammars(model):
    record = _parse(DEEPSEEK, name, depth)
  record = record or policy_record.build(name, expr or None)
  record.update(name=name)
  if "cell" in entry:
    record["cell"] = entry["cell"]
  return record
