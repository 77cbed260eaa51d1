"""The README's and docs/library.md's Python examples run as written; the map of the design
(docs/architecture.md) lists every folder."""

import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"
LIBRARY = REPO / "docs" / "library.md"
ARCHITECTURE = REPO / "docs" / "architecture.md"


def _run_python_blocks(path):
  blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
  assert blocks, f"{path.name} has no python example"
  namespace = {}
  for code in blocks:
    exec(compile(code, str(path), "exec"), namespace)  # noqa: S102
  return namespace


@pytest.mark.slow
def test_readme_python_blocks_run():
  namespace = _run_python_blocks(README)
  qt = namespace["qt"]
  assert str(qt.data.dtype) == "float8_e4m3fn" and qt.scale_inv.shape == (4, 8)
  q4 = namespace["q4"]
  assert str(q4.data.dtype) == "float4_e2m1fn" and str(q4.scale_inv.dtype) == "float8_e4m3fn"
  assert (pathlib.Path(namespace["out"]) / "report.md").is_file()


@pytest.mark.slow
def test_library_page_python_blocks_run():
  namespace = _run_python_blocks(LIBRARY)
  qt = namespace["qt"]
  assert str(qt.data.dtype) == "float8_e4m3fn" and qt.scale_inv.shape == (4, 8)
  assert namespace["state"].fwd.shape == (1024,)
  q4 = namespace["q4"]
  assert str(q4.data.dtype) == "float4_e2m1fn" and str(q4.scale_inv.dtype) == "float8_e4m3fn"
  assert q4.scale_inv.shape == (4, 64) and q4.tensor_scale_inv.shape == ()
  assert namespace["fp4_model"].bf16_tail_layers(9) == 1


def test_map_of_the_design_lists_every_folder():
  """Every folder that holds tracked files appears in docs/architecture.md's map."""
  files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
  folders = {str(pathlib.PurePosixPath(f).parent) for f in files} - {"."}
  section = ARCHITECTURE.read_text().split("## Map of the design", 1)[1].split("\n## ", 1)[0]
  listed = set(re.findall(r"^\| `([^`]+?)/?`", section, flags=re.M))
  # Raw measurements keep each run's own folder layout under docs/perf_raw/; the tests'
  # folders mirror the library (tests/project/test_tests_mirror.py checks their shape).
  missing = sorted(f for f in folders if f not in listed and not any(
      f.startswith(f"{parent}/") and parent in listed for parent in ("docs/perf_raw", "tests")))
  assert not missing, f"folders missing from the map in docs/architecture.md: {missing}"
