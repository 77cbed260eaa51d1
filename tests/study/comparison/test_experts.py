"""The report's routing and per-expert section, on a sweep of known numbers held in memory."""

import dataclasses
import math
import pathlib

import numpy as np
import pytest

from fp8jax.study.common import metric_registry
from fp8jax.study.common.results import Results
from fp8jax.study.comparison import experts

STEPS = (0, 10)


def _sweep(routing: bool = True, per_expert: bool = True, reference: str | None = None
           ) -> Results:
  """Two policies and a floor, 2 checkpoints x 2 batches, 2 MoE layers of 3 experts:
  ``fp4`` changes 10% / 20% of the tokens' experts (batch 0 / 1) in layer 1 only and its
  expert e's gradient by (e + 1) x 0.1 in layer 0, 0.01 in layer 1; expert 2 of layer 1
  gets no token in batch 1 (its rel_err and cosine undefined there). ``reference``: the
  precision ``meta.json`` records for the reference (None: none, an older folder)."""
  meta = {"policies": {"bf16": {"kind": "policy"}, "fp4": {"kind": "policy"},
                       "floor": {"kind": "floor"}},
          "steps": list(STEPS), "windows": {"offsets": [0], "batches": 2}}
  if reference:
    meta["reference"] = {"precision": reference}
  rows, details, base = [], [], []
  for s in STEPS:
    for b in (0, 1):
      ids = {"step": s, "offset": 0, "batch": b}
      base.append({**ids, "finite": True})
      for p, scale in (("bf16", 0.0), ("fp4", 1.0), ("floor", 0.1)):
        row = {**ids, "policy": p, "finite": True, "rel_err": 0.1 * scale}
        if routing:
          row.update({"routing/0/topk_set_diff_frac": 0.0,
                      "routing/1/topk_set_diff_frac": scale * (0.1 + 0.1 * b)})
        rows.append(row)
        line = {**ids, "policy": p}
        if per_expert:
          rel = [[scale * 0.1 * (e + 1) for e in range(3)], [scale * 0.01] * 3]
          if b == 1:
            rel[1][2] = math.nan
          line["by_expert"] = {str(lay): {"diff_norm": [2 * r for r in rel[lay]],
                                          "rel_err": rel[lay],
                                          "cosine": [1 - r for r in rel[lay]]}
                               for lay in (0, 1)}
          line["expert_tokens"] = {"0": [10, 20, 2], "1": [16, 16 + 2 * b, 0 if b else 2]}
        details.append(line)
  return Results(pathlib.Path("/sweep"), meta, rows, details, base, [])


def test_routing_divergence_per_policy_and_layer():
  table = experts.routing_table(_sweep())
  assert list(table) == ["bf16", "fp4", "floor"]
  assert table["bf16"][1].mean == 0 and table["fp4"][0].mean == 0
  assert table["fp4"][1].mean == pytest.approx(0.15) and table["fp4"][1].n == 4
  assert table["floor"][1].mean == pytest.approx(0.015)


def test_per_expert_metrics_and_tokens():
  table = experts.expert_table(_sweep())
  fp4 = table["fp4"]
  assert sorted(fp4) == [(lay, e) for lay in (0, 1) for e in range(3)]
  assert fp4[(0, 2)]["rel_err"].mean == pytest.approx(0.3)  # geometric mean of equal values
  assert fp4[(0, 1)]["diff_norm"].mean == pytest.approx(0.4)
  assert fp4[(0, 0)]["cosine"].mean == pytest.approx(0.9)
  assert fp4[(1, 2)]["rel_err"].n == 2  # the batches where the expert had no token: out
  assert fp4[(1, 1)]["expert_tokens"].mean == pytest.approx(17.0)  # arithmetic: a count
  assert table["bf16"][(0, 0)]["diff_norm"].mean == 0


def test_markdown_tables_and_no_section_without_a_router():
  lines = experts.markdown(_sweep(), top_k=2)
  text = "\n".join(lines)
  assert lines[0] == "## Routing and experts"
  assert "| fp4 | 0 | 0.15 | 0.075 |" in text and "| bf16 | 0 | 0 | 0 |" in text
  fp4 = [line for line in lines if line.startswith("| fp4 | ")][1:]  # per-expert rows
  assert [line.split(" | ")[1:3] for line in fp4] == [["0", "2"], ["0", "1"]]  # largest first
  assert np.isclose(float(fp4[0].split(" | ")[4]), 0.6)
  assert experts.markdown(_sweep(routing=False, per_expert=False)) == []
  only_routing = "\n".join(experts.markdown(_sweep(per_expert=False)))
  assert "layer 1" in only_routing and "Per-expert" not in only_routing


def test_the_metrics_and_their_scales_come_from_the_registry(monkeypatch):
  assert set(experts.EXPERT_METRICS) == set(metric_registry.expert_names()) == {
      "diff_norm", "rel_err", "cosine"}
  assert experts.EXPERT_METRICS[0] == experts.RANK_BY == "diff_norm"
  assert not hasattr(experts, "_POSITIVE")  # no table of its own
  assert experts.expert_table(_sweep())["fp4"][(1, 1)]["expert_tokens"].mean == 17.0
  # Registered on the log scale, the tokens (16 and 18 per batch) get a geometric mean.
  tokens = metric_registry.get("expert_tokens")
  monkeypatch.setitem(metric_registry._BY_NAME, "expert_tokens",  # pylint: disable=protected-access
                      dataclasses.replace(tokens, scale=metric_registry.LOG))
  got = experts.expert_table(_sweep())["fp4"][(1, 1)]["expert_tokens"].mean
  assert got == pytest.approx(math.sqrt(16 * 18))


@pytest.mark.parametrize("reference,label", [(None, "BF16"), ("bf16", "BF16"),
                                             ("fp32", "FP32")])
def test_the_reference_is_named_by_its_precision(reference, label):
  text = "\n".join(experts.markdown(_sweep(reference=reference)))
  assert f"| tokens ({label}) |" in text and f"the {label} reference pass" in text
  other = {"BF16": "FP32", "FP32": "BF16"}[label]
  assert other not in text
