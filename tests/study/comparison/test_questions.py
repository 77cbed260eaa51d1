"""The study's questions on a grid whose second module is a dense model's MLP."""

import json

from fp8jax.study.common import results
from fp8jax.study.comparison import questions
from tests.study.test_sweep_report import build


def _as_mlp_grid(folder):
  """The synthetic sweep's records with the MoE cells named as a dense model's MLP cells
  (the same numbers)."""
  meta = json.loads((folder / "meta.json").read_text())
  for entry in meta["policies"].values():
    cell = (entry.get("record") or {}).get("cell")
    if cell and cell["module"] == "moe":
      cell["module"] = "mlp"
  (folder / "meta.json").write_text(json.dumps(meta))
  return folder


def test_the_module_question_compares_attention_with_the_grids_other_module(tmp_path):
  moe = results.load(build(tmp_path / "moe", records=True))
  mlp = results.load(_as_mlp_grid(build(tmp_path / "mlp", records=True)))
  assert questions.other_module(moe) == "moe" and questions.other_module(mlp) == "mlp"
  a, b = questions.module_answer(moe), questions.module_answer(mlp)
  assert a["available"] and b["available"] and b["module"] == "mlp"
  assert len(a["settings"]) == len(b["settings"]) == 4
  for x, y in zip(a["settings"], b["settings"]):
    assert (x["depth"], x["format"], x["attn"], x["moe"]) == (
        y["depth"], y["format"], y["attn"], y["mlp"])
    assert x["comparison"]["ratio"] == y["comparison"]["ratio"]
  assert b["summary"] == a["summary"].replace("MoE", "MLP")
  text = "\n".join(questions.markdown({"module": b}))
  assert "attention vs MLP" in text and "MoE" not in text and "MLP shape" in text
  assert "attention vs MoE" in "\n".join(questions.markdown({"module": a}))


def test_a_grid_without_attention_and_its_other_module_cannot_answer(tmp_path):
  only_attn = [f"attn_{d}_{f}" for d in ("l0", "l0-8") for f in ("e4m3", "e5m2")]
  res = results.load(build(tmp_path / "s", policies=only_attn, records=True))
  answer = questions.module_answer(res)
  assert not answer["available"] and "an attention and a MoE policy" in answer["summary"]
