"""fp8jax.study.notebook: the banner and tables the Colab notebooks share."""

import io

import numpy as np
import pytest

from fp8jax.study import notebook


def test_start_reads_the_size_and_prints_the_versions(monkeypatch):
  for value, smoke in (("1", True), ("0", False)):
    monkeypatch.setenv("FP8JAX_SMOKE", value)
    out = io.StringIO()
    session = notebook.start(out)
    assert session.smoke is smoke and session.interactive is False
    assert 0 <= session.elapsed() < 60
    text = out.getvalue()
    assert text.startswith("jax ") and "fp8jax " in text and "devices:" in text
    assert text.rstrip().endswith("smoke size" if smoke else "full size")
  monkeypatch.delenv("FP8JAX_SMOKE")
  assert notebook.start(io.StringIO()).smoke is False
  monkeypatch.setenv("FP8JAX_SMOKE", "yes")
  with pytest.raises(ValueError, match="FP8JAX_SMOKE='yes'"):
    notebook.start(io.StringIO())


def test_table_cells_and_lines():
  rows = [{"name": "a", "x": 1 / 3, "ok": True, "n": 7},
          {"name": "b", "x": np.float32(2.5e-7), "ok": np.bool_(False), "n": None}]
  assert notebook.table_lines(rows, title="T") == [
      "**T**", "", "| name | x | ok | n |", "|---|---|---|---|",
      "| a | 0.3333 | yes | 7 |", "| b | 2.5e-07 | no |  |", ""]
  assert notebook.table_lines(rows, ["n", "name"])[2:] == ["| 7 | a |", "|  | b |", ""]
  assert notebook.table_lines([], ["x"]) == ["| x |", "|---|", ""]
  with pytest.raises(ValueError, match=r"empty table \(T\) needs its columns"):
    notebook.table_lines([], title="T")


def test_show_table_prints_outside_a_notebook():
  out = io.StringIO()
  notebook.show_table([{"a": 1.0}], title="one", stream=out)
  assert out.getvalue() == "**one**\n\n| a |\n|---|\n| 1 |\n\n"


def test_row_finds_exactly_one():
  rows = [{"k": 1, "scale rule": "a"}, {"k": 2, "scale rule": "a"}]
  assert notebook.row(rows, k=2)["k"] == 2
  assert notebook.row(rows, **{"scale rule": "a", "k": 1})["k"] == 1
  with pytest.raises(LookupError, match="2 rows match"):
    notebook.row(rows, **{"scale rule": "a"})
  with pytest.raises(LookupError, match="0 rows match"):
    notebook.row(rows, k=3)


def test_show_tree_prints_one_line_per_leaf():
  out = io.StringIO()
  notebook.show_tree({"b": {"w": np.array([[3.0, 4.0]])}, "a": np.zeros(2)}, stream=out)
  lines = out.getvalue().splitlines()
  assert [line.split()[0] for line in lines] == ["a", "b/w"]
  assert lines[0].endswith("|x| = 0") and "(1, 2)" in lines[1] and lines[1].endswith("= 5")
