"""The README's and docs/library.md's Python examples run as written; the map of the design
(docs/architecture.md) lists every folder."""

import os
import pathlib
import re
import shlex
import subprocess
import sys

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
  assert namespace["get_config"]().model == "my_lm:tiny"
  assert namespace["logits"].shape == (2, 16, 320)
  report = [line.split() for line in namespace["fp8jax"].describe(
      namespace["forward"], namespace["rules"], namespace["params"],
      namespace["tokens"]).splitlines()[1:]]
  assert sorted(r[0] for r in report) == ["head/kernel", "mlp/0/kernel", "mlp/1/kernel"]
  assert all(r[3:5] == ["recipe", "mxfp8"] for r in report)
  from fp8jax.models import registry
  assert "my_lm:tiny" in registry.known()  # the README's model, registered by its block


SMALL = {"train": ["--config.train.steps=4", "--config.train.save_every=2",
                   "--config.train.log_every=2", "--config.optim.warmup_steps=1",
                   "--config.data.seq_len=32", "--config.data.global_batch=4"],
         "compare": ["--steps=0,4", "--batches=1", "--batch_size=4"],
         "branch": ["--from_steps=2", "--k=2"], "report": []}
SMALL["validate"] = SMALL["train"]


def readme_pipeline() -> tuple[str, list[list[str]]]:
  """The README's "Use it on your model": the source of ``my_lm.py`` and its commands,
  one argument list per stage (continued lines joined, comments dropped)."""
  section = README.read_text().split("### Use it on your model", 1)[1].split("\n### ", 1)[0]
  source = re.search(r"```python\n(# my_lm\.py.*?)```", section, flags=re.S).group(1)
  script = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
  commands = [shlex.split(line, comments=True)
              for line in script.replace("\\\n", " ").splitlines() if line.strip()]
  return source, commands


@pytest.mark.slow
def test_readme_runs_the_pipeline_on_its_own_model(tmp_path):
  """The README's model through train, compare, branch, validate and report: its commands
  as written, from the folder of ``my_lm.py``, with smaller sizes appended."""
  source, commands = readme_pipeline()
  (tmp_path / "my_lm.py").write_text(source)
  stages = [c[2].rpartition(".")[2] for c in commands]
  assert stages == ["train", "compare", "branch", "validate", "report"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  for stage, command in zip(stages, commands):
    assert command[:2] == ["python", "-m"]
    out = subprocess.run([sys.executable, *command[1:], *SMALL[stage]], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{stage}: {out.stderr[-3000:]}"
  report = (tmp_path / "out" / "my_lm" / "compare" / "report.md").read_text()
  assert "my_lm:tiny" in report and "| gemm:nvfp4 (`nvfp4`) | 4 |" in report
  assert "### Full training runs" in report  # the validation matrix, read by the report
  assert "mlp" in report and "routed_experts" not in report  # its own classifier


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
