"""The README's Python examples run as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
  blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
  assert blocks, "the README has no python example"
  namespace = {}
  for code in blocks:
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102
  qt = namespace["qt"]
  assert str(qt.data.dtype) == "float8_e4m3fn" and qt.scale_inv.shape == (4, 8)
  assert namespace["state"].fwd.shape == (1024,)
