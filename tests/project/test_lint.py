"""The repository passes ruff (configured in pyproject.toml)."""

import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_ruff_check_passes():
  ruff = shutil.which("ruff") or str(pathlib.Path(sys.executable).parent / "ruff")
  if not pathlib.Path(ruff).exists():
    pytest.fail("ruff is not installed: install the dev extra (pip install -e .[dev])")
  result = subprocess.run([ruff, "check", str(REPO)], capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stdout + result.stderr
