"""Document sources that need no download.

* :func:`embedded_corpus`: real English that ships with every CPython: the help topics of
  the Python documentation (``pydoc_data.topics``, generated from the Python Language
  Reference; about 0.5 MB in 79 documents for Python 3.12).
* :func:`text_files`: local ``.txt`` files (one document each) or ``.jsonl`` files (one
  document per line, in the ``text`` field).
"""

from __future__ import annotations

import json
import pathlib


def embedded_corpus() -> list[str]:
  """The Python documentation's help topics, sorted by topic name."""
  from pydoc_data.topics import topics  # pylint: disable=import-outside-toplevel

  return [topics[name] for name in sorted(topics)]


def text_files(paths, field: str = "text") -> list[str]:
  """Documents from ``.txt`` (whole file) and ``.jsonl`` (``field`` per line) files.

  Raises:
    FileNotFoundError: a path does not exist.
    ValueError: a JSONL line is not JSON or lacks ``field``, named by file and line.
  """
  docs = []
  for path in map(pathlib.Path, paths):
    if not path.exists():
      raise FileNotFoundError(f"no such data file: {path}")
    if path.suffix == ".jsonl":
      for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
          continue
        try:
          docs.append(json.loads(line)[field])
        except (json.JSONDecodeError, KeyError, TypeError):
          raise ValueError(f"{path}:{n}: not a JSON object with a {field!r} field") from None
    else:
      docs.append(path.read_text(encoding="utf-8"))
  return docs
