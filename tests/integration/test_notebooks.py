"""The Colab notebooks: paired sources, no committed outputs, and they run.

Every notebook in ``colab/`` is a jupytext ``py:percent`` source (``NAME.py``, the file
to edit and review) paired with the ``NAME.ipynb`` that Colab opens. :func:`pairing_problems`
checks that each side has its partner, that both hold the same cells (types and sources;
metadata and outputs are ignored) and that the ``.ipynb`` files carry no outputs.
``jupytext --sync colab/NAME.py`` repairs a drifted pair.

Each notebook is also executed at smoke size (``FP8JAX_SMOKE=1``, CPU) by nbmake in a
separate pytest process, with a kernel of this interpreter; a failure shows the failing
cell and its traceback.
"""

import difflib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
COLAB = REPO / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))
PAIRING = {"ipynb", "py:percent"}
TIMEOUT_S = 600
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colours of IPython tracebacks


def _require(module: str):
  try:
    return __import__(module)
  except ImportError:
    pytest.fail(f"{module} is not installed: install the notebooks extra "
                "(pip install -e .[notebooks])")


def _cells(notebook) -> list[tuple[str, str]]:
  return [(cell.cell_type, cell.source) for cell in notebook.cells]


def _first_difference(name: str, py_cells, nb_cells) -> str:
  for i, (a, b) in enumerate(zip(py_cells, nb_cells)):
    if a != b:
      diff = difflib.unified_diff(b[1].splitlines(), a[1].splitlines(), f"{name}.ipynb",
                                  f"{name}.py", lineterm="", n=1)
      return (f"{name}: cell {i} differs ({b[0]} in the .ipynb, {a[0]} in the .py):\n"
              + "\n".join(list(diff)[:20]))
  return (f"{name}: {len(py_cells)} cells in the .py, {len(nb_cells)} in the .ipynb "
          "(the rest agree)")


def pairing_problems(folder: pathlib.Path) -> list[str]:
  """Everything wrong with the notebook pairs in ``folder``; empty when all is well."""
  jupytext = _require("jupytext")
  sources = {p.stem: p for p in folder.glob("*.py")}
  notebooks = {p.stem: p for p in folder.glob("*.ipynb")}
  problems = [f"{sources[s].name} has no paired {s}.ipynb (run jupytext --sync)"
              for s in sorted(sources.keys() - notebooks.keys())]
  problems += [f"{notebooks[s].name} has no paired {s}.py (run jupytext --to py:percent)"
               for s in sorted(notebooks.keys() - sources.keys())]
  for stem in sorted(sources.keys() & notebooks.keys()):
    py = jupytext.read(sources[stem])
    formats = py.metadata.get("jupytext", {}).get("formats", "")
    if set(formats.split(",")) != PAIRING:
      problems.append(f"{stem}.py: jupytext formats are {formats!r}, expected "
                      "'ipynb,py:percent'")
    py_cells, nb_cells = _cells(py), _cells(jupytext.read(notebooks[stem]))
    if py_cells != nb_cells:
      problems.append(_first_difference(stem, py_cells, nb_cells))
    raw = json.loads(notebooks[stem].read_text(encoding="utf-8"))
    executed = [i for i, cell in enumerate(raw["cells"])
                if cell.get("outputs") or cell.get("execution_count") is not None]
    if executed:
      problems.append(f"{stem}.ipynb: cells {executed} carry outputs or execution counts; "
                      "strip them (jupytext --sync writes none)")
  return problems


def test_notebooks_are_paired_and_stripped():
  assert NOTEBOOKS, f"no notebooks in {COLAB}"
  problems = pairing_problems(COLAB)
  assert not problems, "\n\n".join(problems)


def test_install_cell_does_nothing_where_fp8jax_is_importable(monkeypatch):
  """The Colab install cell must not call pip when fp8jax is already there (CI, checkouts)."""
  jupytext = _require("jupytext")

  def no_subprocess(*args, **kwargs):
    raise AssertionError(f"the install cell ran {args}")

  monkeypatch.setattr(subprocess, "run", no_subprocess)
  for notebook in NOTEBOOKS:
    cells = [c.source for c in jupytext.read(notebook).cells
             if c.cell_type == "code" and "pip" in c.source]
    assert len(cells) == 1, f"{notebook.name}: expected one install cell, found {len(cells)}"
    exec(compile(cells[0], f"{notebook.name}:install", "exec"), {})


# --- the checker itself, on a drifted copy -------------------------------------------


def _edit_notebook(path: pathlib.Path, edit) -> None:
  raw = json.loads(path.read_text(encoding="utf-8"))
  edit(raw)
  path.write_text(json.dumps(raw, indent=1), encoding="utf-8")


def _append_line_to_first_code_cell(raw):
  cell = next(c for c in raw["cells"] if c["cell_type"] == "code")
  cell["source"] = "".join(cell["source"]) + "\nprint('only in the .ipynb')"


def _add_output(raw):
  cell = next(c for c in raw["cells"] if c["cell_type"] == "code")
  cell["execution_count"] = 1
  cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["hello\n"]}]


def _first_cell_to_code(raw):
  raw["cells"][0].update(cell_type="code", outputs=[], execution_count=None)


def _drop_source_formats(py: pathlib.Path):
  text = py.read_text(encoding="utf-8")
  assert "formats: ipynb,py:percent" in text
  py.write_text(text.replace("formats: ipynb,py:percent", "formats: py:percent"),
                encoding="utf-8")


DRIFTS = {
    "source_gains_a_cell": lambda py, nb: py.write_text(
        py.read_text(encoding="utf-8") + "\n# %%\nprint('only in the .py')\n",
        encoding="utf-8"),
    "notebook_cell_edited": lambda py, nb: _edit_notebook(nb, _append_line_to_first_code_cell),
    "markdown_becomes_code": lambda py, nb: _edit_notebook(nb, _first_cell_to_code),
    "notebook_has_outputs": lambda py, nb: _edit_notebook(nb, _add_output),
    "notebook_missing": lambda py, nb: nb.unlink(),
    "source_missing": lambda py, nb: py.unlink(),
    "pairing_metadata_lost": lambda py, nb: _drop_source_formats(py),
}


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_pairing_check_catches_drift(drift, tmp_path):
  folder = tmp_path / "colab"
  shutil.copytree(COLAB, folder)
  assert pairing_problems(folder) == []
  notebook = folder / NOTEBOOKS[0].name
  DRIFTS[drift](notebook.with_suffix(".py"), notebook)
  problems = pairing_problems(folder)
  assert len(problems) == 1, problems
  assert notebook.stem in problems[0]


# --- execution -------------------------------------------------------------------------


def _kernel_env(tmp_path: pathlib.Path) -> dict:
  """Environment for the nbmake run: smoke size, CPU, a python3 kernel of this interpreter."""
  spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "Python 3", "language": "python"}), encoding="utf-8")
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("PYTEST_") and k != "MPLBACKEND"}
  env.update(FP8JAX_SMOKE="1", JAX_PLATFORMS="cpu", JUPYTER_PATH=str(tmp_path / "jupyter"),
             PYDEVD_DISABLE_FILE_VALIDATION="1")
  return env


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_at_smoke_size(notebook, tmp_path):
  for module in ("nbmake", "ipykernel"):
    _require(module)
  cmd = [sys.executable, "-m", "pytest", "--nbmake", f"--nbmake-timeout={TIMEOUT_S}",
         "-p", "no:cacheprovider", "-q", str(notebook)]
  try:
    result = subprocess.run(cmd, cwd=REPO, env=_kernel_env(tmp_path), capture_output=True,
                            text=True, timeout=TIMEOUT_S + 60, check=False)
  except subprocess.TimeoutExpired as e:
    out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
    pytest.fail(f"{notebook.name} did not finish in {TIMEOUT_S + 60} s:\n{(out or '')[-12000:]}")
  log = _ANSI.sub("", f"{result.stdout[-12000:]}\n{result.stderr[-4000:]}")
  assert result.returncode == 0, f"{notebook.name} failed at smoke size ({' '.join(cmd)}):\n{log}"
