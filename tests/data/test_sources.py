"""fp8jax.data.sources: the embedded corpus, and text and jsonl files streamed as documents."""


import pytest

from fp8jax.data import sources


def test_embedded_corpus_is_real_english():
  docs = sources.embedded_corpus()
  text = " ".join(docs)
  assert len(docs) > 50 and len(text) > 300_000
  words = text.lower().split()
  assert words.count("the") > 0.02 * len(words)  # English prose, not code or noise


def test_text_and_jsonl_files_stream(tmp_path):
  (tmp_path / "a.txt").write_text("hello world\nsecond line\n")  # one document per line
  (tmp_path / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two"}\n')
  docs = sources.text_files([tmp_path / "a.txt", tmp_path / "b.jsonl"])
  assert next(docs) == "hello world"  # a generator: documents are read one at a time
  assert list(docs) == ["second line", "one", "two"]
  (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "x"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:2: no field 'text' \(has \['body'\]\)"):
    list(sources.text_files([tmp_path / "bad.jsonl"]))
  assert list(sources.text_files([tmp_path / "bad.jsonl"], skip_bad=True)) == ["ok"]
  with pytest.raises(FileNotFoundError, match="no data shard matches"):
    list(sources.text_files([tmp_path / "missing.txt"]))
