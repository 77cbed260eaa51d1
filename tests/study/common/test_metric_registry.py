"""The metric registry: every column a sweep writes is registered, the registry is
consistent with the report's views, and an unknown metric is refused by name."""

import dataclasses

import pytest

from fp8jax.study import sweep_report
from fp8jax.study.branches import trajectory, trajectory_figures
from fp8jax.study.common import metric_registry as reg
from fp8jax.study.common import results, results_io, stats
from fp8jax.study.comparison import conditioning, experts, figures, floor, sweep_rows
from tests.study.test_sweep_report import SEED, build

IDS = frozenset(results.ROW_KEYS + results.STATUS_KEYS)
"""The columns of a row that identify it or say whether it is finite: not metrics."""


def unregistered(rows: list[dict], check) -> list[str]:
  """The metric columns of ``rows`` (identity and status aside) that ``check`` refuses."""
  bad = []
  for col in sorted({k for r in rows for k in r} - IDS):
    try:
      check(col)
    except KeyError as e:
      bad.append(str(e))
  return bad


def baseline_field(name: str) -> None:
  if not reg.get(name).baseline:
    raise KeyError(f"{name!r} is not registered as a baseline.jsonl field")


@pytest.mark.slow
def test_a_real_sweep_writes_only_registered_columns(tmp_path):
  """A tiny DeepSeek-MoE sweep with a GEMM recipe (direct share, routing, telemetry) and
  the noise floor: every column of rows.jsonl and baseline.jsonl is registered in one of
  its metric's forms, and every registered column is written."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from fp8jax.models import config as mc  # pylint: disable=import-outside-toplevel
  from fp8jax.models import deepseek_model, deepseek_moe  # pylint: disable=import-outside-toplevel
  from fp8jax.study.comparison import model_sweep, policies  # pylint: disable=import-outside-toplevel
  cfg = mc.tiny(num_hidden_layers=2, n_routed_experts=4)
  pols = policies.expand_policies(["gemm:mxfp4"], cfg.num_hidden_layers)
  tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, cfg.vocab_size, jnp.int32)
  out = tmp_path / "cmp"
  model_sweep.evaluate(deepseek_model.model(cfg), out, pols,
                       deepseek_moe.init(cfg, jax.random.key(0)), [tokens], telemetry=True)
  rows = results_io.read(out / "rows.jsonl")
  base = results_io.read(out / "baseline.jsonl")
  assert {r["policy"] for r in rows} == {"gemm:mxfp4", "floor"} and len(base) == 1
  assert all(IDS <= set(r) for r in rows)
  assert set(results.ROW_KEYS[:3]) | set(results.STATUS_KEYS) <= set(base[0])
  assert unregistered(rows, reg.column_metric) == []
  assert unregistered(base, baseline_field) == []
  written = {reg.get(c).name for r in rows for c in set(r) - IDS}
  assert [m.name for m in reg.METRICS if m.columns and m.name not in written] == []
  assert [m.name for m in reg.METRICS if m.baseline and m.name not in base[0]] == []


def test_the_synthetic_sweeps_of_the_report_tests_write_registered_columns(tmp_path):
  folder = build(tmp_path / "s", policies=SEED[:2], steps=(0, 100), floor=True,
                 controls={SEED[0]: (2.0, 2.0, 2.0, 2.0)})
  res = results.load(folder)
  assert unregistered(res.rows, reg.column_metric) == []
  assert unregistered(res.baseline, baseline_field) == []


def test_the_report_reads_the_registry():
  assert reg.problems() == []
  assert stats.POSITIVE == reg.positive_names()
  assert {"rel_err", "diff_norm", "grad_norm", "curvature"} <= stats.POSITIVE
  assert not {"cosine", "share_direct", "topk_set_diff_frac", "kurtosis"} & stats.POSITIVE
  # The report's tables keep their columns and their order.
  assert sweep_report.SUMMARY_METRICS == ("rel_err", "diff_norm", "cosine", "loss_rel_err",
                                    "share_direct")
  assert floor.FLOOR_METRICS == ("rel_err", "loss_rel_err")
  assert list(trajectory.PREDICTORS) == ["rel_err", "share_direct", "routing"]
  assert list(conditioning.SIGNALS) == ["loss", "grad_norm", "floor_rel_err", "curvature"]
  assert conditioning.FLAG_SIGNALS == ("grad_norm", "floor_rel_err", "curvature")
  assert list(trajectory.EXTRA_PREDICTORS)[:5] == ["floor_multiple", *conditioning.SIGNALS]
  assert list(trajectory.EXTRA_PREDICTORS)[5:] == [f"tel/{k}" for k in conditioning.TELEMETRY]
  assert trajectory.EXTRA_PREDICTORS["grad_norm"] == "reference gradient norm (checkpoint)"
  assert conditioning.SIGNALS["loss"] == "reference loss"  # whatever its precision
  # The report's section on experts reads its metrics and their scales here too.
  assert reg.expert_names() == ("rel_err", "diff_norm", "cosine")
  assert set(experts.EXPERT_METRICS) == set(reg.expert_names())
  assert sweep_rows.EXPERT_METRICS == reg.expert_names()
  assert not reg.is_positive("expert_tokens") and reg.get("expert_tokens").columns == ()
  assert trajectory.EXTRA_PREDICTORS["tel/kurtosis"] == (
      "telemetry: kurtosis of the quantized activations")
  assert list(trajectory.OUTCOMES) == ["param_div", "loss_gap", "update_cos", "routing_div",
                                       "growth_rate"]
  for view in (sweep_report.SUMMARY_METRICS, floor.FLOOR_METRICS, trajectory.PREDICTORS,
               trajectory.EXTRA_PREDICTORS, trajectory.OUTCOMES, conditioning.SIGNALS):
    assert all(reg.get(name) for name in view)
  # Figures are not metrics: each metric names the figures that plot it, and they exist.
  drawn = {*figures.NAMES, trajectory_figures.NAME}
  assert {f for m in reg.METRICS for f in m.figures} <= drawn
  assert reg.plotted_in("loss_vs_grad") == ("rel_err", "loss_rel_err")
  assert set(trajectory.PREDICTORS) | set(trajectory_figures.ROWS) <= set(
      reg.plotted_in(trajectory_figures.NAME))


def test_problems_name_what_is_inconsistent():
  rel = reg.get("rel_err")
  bad = (rel, dataclasses.replace(rel, scale="ln", doc="two\nlines"),
         dataclasses.replace(reg.get("loss"), name="loss2", label="", flag=True, signal=False),
         dataclasses.replace(rel, name="x", columns=("module/*",), predictor="sometimes"))
  got = "\n".join(reg.problems(bad))
  for text in ("'rel_err': a duplicate", "scale 'ln'", "doc must be one line",
               "loss2: flags checkpoints but is no signal", "loss2: a predictor, signal",
               "x: a column form lacks the name", "predictor 'sometimes'"):
    assert text in got, got
  with pytest.raises(dataclasses.FrozenInstanceError):
    rel.scale = reg.LINEAR


def test_lookups_read_prefixed_names_and_refuse_unknown_ones():
  assert reg.get("moe/rel_err") is reg.get("module/attn_o/rel_err") is reg.get("rel_err")
  assert reg.is_positive("layer/0/diff_norm") and not reg.is_positive("cosine")
  assert stats.is_positive("routing/1/topk_set_diff_frac") is False
  assert reg.column_metric("tel/kurtosis").label == "kurtosis of the quantized activations"
  assert reg.column_metric("group/moe/norm_fp8").name == "norm_fp8"
  with pytest.raises(KeyError, match=r"metric 'wobble' is not registered .*registered: "
                                     r"rel_err, diff_norm"):
    reg.get("wobble")
  with pytest.raises(KeyError, match=r"'module/attn_o/wobble' \(read as 'wobble'\)"):
    stats.is_positive("module/attn_o/wobble")
  for column, forms in (("tel/x/kurtosis", "tel/kurtosis"),
                        ("routing/1/rel_err", "rel_err, module/\\*/rel_err"),
                        ("loss_gap", "no rows.jsonl column"),
                        ("grad_norm", "no rows.jsonl column")):
    with pytest.raises(KeyError, match=f"column '{column}': .* registered as {forms}"):
      reg.column_metric(column)
