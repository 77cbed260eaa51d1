"""Document shards (fp8jax.data.shards): layouts, bad records named or counted (also by the
streaming batches), and the pipeline's file source. Fixtures are built here, in each layout.
The streaming batches' order, processes and resume: ``tests/data/test_stream.py``."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest

from fp8jax.data import pipeline, shards, sources, stream
from tests.data_fixtures import TOK, c4_docs, take, write_c4


def test_every_layout_streams_its_documents(tmp_path):
  docs = c4_docs(0, 9)
  want = [d for d in docs if d]
  (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n\n")
  with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
    f.write("\n".join(json.dumps({"text": d, "url": "u"}) for d in docs))  # no final newline
  with gzip.open(tmp_path / "c.txt.gz", "wt") as f:
    f.write("\n".join(docs) + "\n")
  (tmp_path / "d.txt").write_text("\n".join(docs))
  for name in ("a.jsonl", "b.jsonl.gz", "c.txt.gz", "d.txt"):
    with shards.ShardReader(tmp_path / name) as reader:
      got = list(reader)
    assert [t for _, t in got] == want, name
    assert [n for n, _ in got] == [i for i, d in enumerate(docs) if d], name  # record numbers
    with shards.ShardReader(tmp_path / name, start=5) as reader:  # a resumed read
      assert [t for _, t in reader] == [d for d in docs[5:] if d]
  assert shards.list_shards([tmp_path / "*.jsonl*", tmp_path]) == [
      tmp_path / n for n in ("a.jsonl", "b.jsonl.gz", "c.txt.gz", "d.txt")]
  assert list(sources.text_files([tmp_path / "a.jsonl"])) == want
  with pytest.raises(FileNotFoundError, match="no data shard matches .*nope"):
    shards.list_shards([tmp_path / "nope*.json.gz"])
  (tmp_path / "e.csv").write_text("x")
  with pytest.raises(ValueError, match="e.csv: unknown shard format"):
    shards.list_shards([tmp_path / "e.csv"])


def test_parquet_shards(tmp_path):
  pa = pytest.importorskip("pyarrow", reason="Parquet shards need pyarrow (the data extra)")
  import pyarrow.parquet as pq

  docs = c4_docs(1, 30)
  pq.write_table(pa.table({"text": docs, "url": ["u"] * 30}), tmp_path / "p.parquet",
                 row_group_size=7)
  with shards.ShardReader(tmp_path / "p.parquet") as reader:
    assert [t for _, t in reader] == [d for d in docs if d]
  with shards.ShardReader(tmp_path / "p.parquet", start=12) as reader:  # mid row group
    assert [n for n, _ in reader] == list(range(12, 30))
  with pytest.raises(shards.BadRecordError, match=r"p.parquet: no column 'body'"):
    list(shards.ShardReader(tmp_path / "p.parquet", field="body"))
  pq.write_table(pa.table({"text": ["a", None, "b"]}), tmp_path / "n.parquet")
  with pytest.raises(shards.BadRecordError, match=r"n.parquet: row 1: column 'text' holds "
                     "NoneType"):
    list(shards.ShardReader(tmp_path / "n.parquet"))


def _gz(path, lines: list[bytes]) -> bytes:
  data = gzip.compress(b"".join(lines))
  path.write_bytes(data)
  return data


@pytest.mark.parametrize("case, error", [
    ("crc", r"bad.json.gz:\d+: corrupt or truncated gzip data after line \d+"),
    ("truncated", r"bad.json.gz:\d+: corrupt or truncated gzip data"),
    ("torn", r"bad.json.gz:40: not valid JSON \(a torn last line"),
    ("utf8", r"bad.json.gz:7: byte 0xff at column 11 is not UTF-8"),
    ("field", r"bad.json.gz:5: no field 'text' \(has \['body', 'url'\]\)"),
    ("type", r"bad.json.gz:2: field 'text' is int, not a string"),
])
def test_bad_records_are_named_or_counted(tmp_path, case, error):
  lines = [json.dumps({"text": f"document {i} " * 20, "url": "u"}).encode() + b"\n"
           for i in range(40)]
  path = tmp_path / "bad.json.gz"
  if case == "torn":
    lines[-1] = lines[-1][:25]
  elif case == "utf8":
    lines[6] = b'{"text": "\xff bad byte", "url": "u"}\n'
  elif case == "field":
    lines[4] = b'{"body": "x", "url": "u"}\n'
  elif case == "type":
    lines[1] = b'{"text": 3}\n'
  data = _gz(path, lines)
  if case == "crc":
    path.write_bytes(data[:-8] + bytes([data[-8] ^ 1]) + data[-7:])  # the CRC-32 trailer
  elif case == "truncated":
    path.write_bytes(data[:len(data) // 2])
  with pytest.raises(shards.BadRecordError, match=error):
    list(shards.ShardReader(path))
  skips = shards.Skips(stream=False)
  with shards.ShardReader(path, skip_bad=True, skips=skips) as reader:
    got = list(reader)
  assert skips.count == 1 and re.search(error, skips.examples[0]), skips.examples
  if case not in ("crc", "truncated"):
    assert len(got) == 39  # exactly the bad one is missing
  # Streaming batches raise it too (from the reading thread), or count it.
  with pytest.raises(shards.BadRecordError, match=error):
    take(stream.ShardBatches([path], TOK, 16, 2), 200)
  it = stream.ShardBatches([path], TOK, 16, 2, skip_bad=True, prefetch=0,
                           skips=shards.Skips(stream=False))
  take(it, 50)
  assert it.skips.count == 1 and it.get_state()["epoch"] == 0  # counted at each reading


def test_pipeline_streams_files_and_names_the_data(tmp_path):
  write_c4(tmp_path / "c4")
  it = pipeline.make_batches("files", TOK, 16, 4, seed=1,
                             paths=(str(tmp_path / "c4" / "c4-train.*.json.gz"),))
  assert isinstance(it.batches, stream.ShardBatches)
  first = take(it, 5)
  state = json.loads(json.dumps(it.get_state()))
  assert state["data"].startswith("files:")
  again = pipeline.make_batches("files", TOK, 16, 4, seed=1, paths=(str(tmp_path / "c4"),))
  again.set_state(state)  # the same shards, named by a folder this time
  np.testing.assert_array_equal(take(again, 2), take(it, 2))
  assert first.shape == (5, 4, 16)
  (tmp_path / "c4" / "c4-train.00009-of-00005.json.gz").write_bytes(
      gzip.compress(b'{"text": "a shard more"}\n'))  # another shard list: other data
  changed = pipeline.make_batches("files", TOK, 16, 4, seed=1, paths=(str(tmp_path / "c4"),))
  with pytest.raises(ValueError, match="saved data position is in data files:.*changed"):
    changed.set_state(state)
  with pytest.raises(shards.BadRecordError, match="no field 'body'"):
    pipeline.validate("files", paths=(str(tmp_path / "c4"),), field="body")
