"""Policy records in sweep folders: the report's answers come from the records, not the
names; folders written before records are read by the one fallback
(fp8jax.study.common.legacy_records), or refused by the policy's name when ambiguous."""

import json

import pytest

from fp8jax.study.common import legacy_records, results
from fp8jax.study.comparison import questions
from tests.study.test_sweep_report import SEED, build

DEEPSEEK = {"num_hidden_layers": 4}


def _record(name, entry, model=DEEPSEEK):
  return legacy_records.legacy_record(name, entry, model)


def test_an_old_entry_is_read_from_its_expression_then_its_name():
  assert _record("anything", {"expr": "moe@0-3:e5m2"})["cell"] == {
      "module": "moe", "depth": "l0-3", "format": "e5m2"}
  # the builder's (and old sweeps') unparsable expression: the site-grid name tells
  old = _record("attn_l0_e4m3", {"expr": "attn@l0_e4m3"})
  assert old["cell"] == {"module": "attn", "depth": "l0", "format": "e4m3"}
  assert old["name"] == "attn_l0_e4m3" and old["sites"][0]["site"] == "attn_out"
  # the expression is what ran, whatever the name says
  assert _record("attn_l0_e4m3", {"expr": "attn@0:mxfp8"})["cell"] is None
  # the version that recorded cells but no records keeps its cell
  assert _record("moe_l0_e4m3", {"expr": "moe@0:e4m3", "cell": None})["cell"] is None
  control = _record("noise(moe_l0_e4m3)", {"expr": "noise(moe_out@0:e4m3/tensor)"})
  assert control["noise"] and control["cell"] is None
  gemm = _record("fmt", {"expr": "gemm:nvfp4_recipe"})["gemm"]
  assert (gemm["recipe"], gemm["bits"], gemm["bf16_layers"]) == ("nvfp4_recipe", 4, [3])
  for name, entry in (("floor", {"expr": "floor"}), ("custom", {"expr": "custom"}),
                      ("x", {"expr": "3 rule(s)"}), ("y", {})):
    empty = _record(name, entry)
    assert (empty["name"], empty["sites"], empty["gemm"], empty["cell"]) == (name, [], None,
                                                                            None)


def test_the_folders_model_picks_the_grammar():
  llama = {"name": "llama:tiny", "num_layers": 4}
  gemm = _record("p", {"expr": r"gemm:nvfp4_recipe@layers/\d+/mlp/.*"}, llama)["gemm"]
  assert (gemm["recipe"], gemm["where"], gemm["bf16_layers"]) == (
      "nvfp4_recipe", r"layers/\d+/mlp/.*", [3])
  assert _record("q", {"expr": "output:e4m3@head"}, llama)["sites"][0]["site"] == "head"
  assert _record("q", {"expr": "output:e4m3@head"})["sites"] == []  # not DeepSeek-MoE's
  assert _record("r", {"expr": "gemm:mxfp8"}, {})["gemm"]["recipe"] == "mxfp8"  # alike


def test_an_ambiguous_old_entry_is_refused_by_name():
  with pytest.raises(ValueError, match="policy 'odd': its expression 'gemm:mxfp8@0-3' reads "
                                       "differently"):
    _record("odd", {"expr": "gemm:mxfp8@0-3"}, {})  # layers 0-3, or the module path '0-3'
  assert _record("odd", {"expr": "gemm:mxfp8@0-3"})["gemm"]["layers"] == [0, 1, 2, 3]


def test_a_record_of_another_version_is_refused_by_name():
  meta = {"policies": {"p": {"expr": "bf16", "record": {"version": 99}}}}
  with pytest.raises(ValueError, match=r"policies\['p'\]: a policy record of version 99"):
    results.Results(None, meta, [], [], [], []).record("p")


def _rename(folder, names: dict[str, str]) -> None:
  """Renames the policies of a sweep folder (meta, rows, details) by ``names``."""
  meta = json.loads((folder / "meta.json").read_text())
  meta["policies"] = {names.get(n, n): e for n, e in meta["policies"].items()}
  (folder / "meta.json").write_text(json.dumps(meta))
  for file in ("rows.jsonl", "details.jsonl"):
    lines = [json.loads(x) for x in (folder / file).read_text().splitlines()]
    (folder / file).write_text("".join(
        json.dumps({**x, "policy": names.get(x["policy"], x["policy"])}) + "\n" for x in lines))


def _summaries(res, back: dict[str, str] | None = None) -> dict[str, str]:
  out = {k: a["summary"] for k, a in questions.answers(res, top_k=3).items()}
  for new, old in (back or {}).items():
    out = {k: v.replace(new, old) for k, v in out.items()}
  return out


def test_the_answers_come_from_the_records_whatever_the_names(tmp_path):
  """A sweep with records answers as the same sweep without them (read by the fallback),
  and as the same sweep with its policies renamed to names no grid knows."""
  old = results.load(build(tmp_path / "old"))
  assert all("record" not in e for e in old.meta["policies"].values())
  new_folder = build(tmp_path / "new", records=True)
  new = results.load(new_folder)
  assert all("record" in e for e in new.meta["policies"].values())
  assert _summaries(new) == _summaries(old)
  assert questions.site_cells(new) == questions.site_cells(old) and len(
      questions.site_cells(new)) == len(SEED)
  names = {name: f"run{i}x" for i, name in enumerate(SEED)}
  _rename(new_folder, names)
  renamed = results.load(new_folder)
  assert set(renamed.policies) == set(names.values())
  assert {c: names[n] for c, n in questions.site_cells(new).items()} == questions.site_cells(
      renamed)
  assert _summaries(renamed, {v: k for k, v in names.items()}) == _summaries(new)
