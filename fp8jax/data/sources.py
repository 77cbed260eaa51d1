"""Document sources that need no download.

* :func:`embedded_corpus`: real English that ships with every CPython: the help topics of
  the Python documentation (``pydoc_data.topics``, generated from the Python Language
  Reference; about 0.5 MB in 79 documents for Python 3.12).
* :func:`text_files`: the documents of local shards (``.jsonl``, ``.json.gz``, ``.txt``
  with one document per line, ...), streamed.
"""

from __future__ import annotations

from fp8jax.data import shards


def embedded_corpus() -> list[str]:
  """The Python documentation's help topics, sorted by topic name."""
  from pydoc_data.topics import topics  # pylint: disable=import-outside-toplevel

  return [topics[name] for name in sorted(topics)]


def text_files(paths, field: str = "text", skip_bad: bool = False):
  """Yields the documents of local shards (files, folders or globs; formats in
  :mod:`fp8jax.data.shards`), one at a time, in file and record order.

  Raises:
    FileNotFoundError: a path matches no file.
    fp8jax.data.shards.BadRecordError: a bad record (unless ``skip_bad``), named by file
      and line.
  """
  for path in shards.list_shards(paths):
    with shards.ShardReader(path, field, skip_bad=skip_bad) as reader:
      for _, text in reader:
        yield text
