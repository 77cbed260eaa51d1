"""Document shards streamed (fp8jax.data.shards, stream): layouts, bad records, order,
disjoint processes, exact resume. Fixtures are built here, in each layout."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest

from fp8jax.data import pipeline, shards, sources, stream
from tests.data_fixtures import TOK, c4_docs, docs_of, take, write_c4


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


def test_stream_matches_the_documented_order(tmp_path):
  files = write_c4(tmp_path, shards_n=5, docs_n=37)
  paths = shards.list_shards([tmp_path / "c4-train.*.json.gz"])
  names = [p.name for p in paths]
  window = 8
  it = stream.ShardBatches(paths, TOK, 16, 4, seed=3, window=window)
  got = docs_of(take(it, 300))
  want, epoch = [], 0
  while len(want) < len(got):  # recomputed from the module docstring's rules
    for s in np.random.default_rng([3, epoch]).permutation(5):
      docs = files[names[s]]
      for w in range(0, len(docs), window):
        block = [d for d in docs[w:w + window] if d]
        want += [block[i] for i in np.random.default_rng([3, epoch, s, w // window]).permutation(
            len(block))]
    epoch += 1
  assert got[:-1] == want[:len(got) - 1]
  assert it.get_state()["epoch"] >= 2


def test_order_is_identical_across_restarts_and_differs_by_seed(tmp_path):
  write_c4(tmp_path)
  paths = shards.list_shards([tmp_path])
  runs = [take(stream.ShardBatches(paths, TOK, 16, 4, seed=1, window=6, prefetch=p), 80)
          for p in (2, 0, 1)]
  np.testing.assert_array_equal(runs[0], runs[1])
  np.testing.assert_array_equal(runs[0], runs[2])
  other = take(stream.ShardBatches(paths, TOK, 16, 4, seed=2, window=6), 80)
  assert not np.array_equal(other, runs[0])


def test_two_processes_read_disjoint_streams(tmp_path):
  files = write_c4(tmp_path, shards_n=6, docs_n=20)
  paths = shards.list_shards([tmp_path])
  every = {d for docs in files.values() for d in docs if d}
  seen = []
  for p in range(2):
    it = stream.ShardBatches(paths, TOK, 8, 4, seed=5, process_index=p, process_count=2,
                             window=4)
    batches = []
    while it.get_state()["epoch"] == 0:
      batches.append(next(it))
    seen.append(set(docs_of(np.stack(batches))[1:-1]))  # whole documents of epoch 0
    assert len(it.my_shards(0)) == 3
  assert seen[0] and seen[1] and not seen[0] & seen[1]
  assert seen[0] | seen[1] <= every and len(seen[0] | seen[1]) >= len(every) - 4
  with pytest.raises(ValueError, match="6 shard.* cannot give 7 processes disjoint streams"):
    stream.ShardBatches(paths, TOK, 8, 7, process_index=0, process_count=7)


@pytest.mark.parametrize("k", [0, 1, 17, 64, 151])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, k):
  write_c4(tmp_path)
  paths = shards.list_shards([tmp_path])
  make = lambda: stream.ShardBatches(paths, TOK, 12, 3, seed=7, window=5)  # noqa: E731
  full = take(make(), k + 40)
  it = make()
  take(it, k)
  state = json.loads(json.dumps(it.get_state()))
  assert set(state) == {"seed", "epoch", "shard", "file", "window", "doc", "offset",
                        "skipped", "read", "sizes"}
  fresh = make()
  fresh.set_state(state)
  np.testing.assert_array_equal(take(fresh, 40), full[k:])
  np.testing.assert_array_equal(take(it, 40), full[k:])
  with pytest.raises(ValueError, match="used seed 7, this run uses 8"):
    stream.ShardBatches(paths, TOK, 12, 3, seed=8).set_state(state)
  moved = {**state, "file": "other.json.gz"}
  with pytest.raises(ValueError, match="is in shard other.json.gz.*different shards"):
    make().set_state(moved)


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



def test_resume_from_every_position_of_two_epochs(tmp_path):
  write_c4(tmp_path, shards_n=3, docs_n=11)
  paths = shards.list_shards([tmp_path])
  make = lambda: stream.ShardBatches(paths, TOK, 8, 2, seed=4, window=4, prefetch=0)  # noqa: E731
  it, states = make(), []
  for _ in range(130):
    states.append(it.get_state())
    next(it)
  full = take(make(), 133)
  assert {s["epoch"] for s in states} >= {0, 1, 2}
  assert any(s["offset"] > 0 for s in states) and any(s["window"] > 0 for s in states)
  for k, state in enumerate(states):
    fresh = make()
    fresh.set_state(state)
    np.testing.assert_array_equal(take(fresh, 3), full[k:k + 3], err_msg=str(state))


def _lines(n: int, bad: tuple[int, ...] = ()) -> list[bytes]:
  return [b'{"text": 3}\n' if i in bad else
          json.dumps({"text": f"doc {i} " + "y" * (i % 7)}).encode() + b"\n" for i in range(n)]


def test_a_shard_may_change_only_past_what_the_run_has_read(tmp_path):
  """Repairs past the current window, or in a shard not reached yet, resume exactly; a
  change in what was read (the current window, a finished shard) is refused, named."""
  paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
  for path in paths:
    path.write_bytes(b"".join(_lines(30, bad=(21,))))
  make = lambda: stream.ShardBatches(paths, TOK, 8, 2, seed=3, window=4,  # noqa: E731
                                     prefetch=0, skip_bad=True,
                                     skips=shards.Skips(stream=False))
  it = make()
  take(it, 3)  # inside window 1 of the first shard of the order, before the bad line 21
  state = json.loads(json.dumps(it.get_state()))
  first = paths[it.my_shards(0)[0]]
  assert state["window"] == 1 and state["read"]["records"] == 8 and state["sizes"] == []
  assert state["skipped"] == 0
  for path in paths:  # repaired: past the window (line 21), and a shard not reached yet
    path.write_bytes(b"".join(_lines(30)))
  repaired = make()
  repaired.set_state(state)
  np.testing.assert_array_equal(take(repaired, 30), take(stream.ShardBatches(
      paths, TOK, 8, 2, seed=3, window=4, prefetch=0), 33)[3:])
  later = json.loads(json.dumps(repaired.get_state()))  # in the second shard
  assert later["shard"] == 1 and later["sizes"] == [first.stat().st_size]
  edited = _lines(30)
  edited[5] = json.dumps({"text": "changed"}).encode() + b"\n"  # in window 1: already read
  first.write_bytes(b"".join(edited))
  with pytest.raises(ValueError, match=rf"data shard {first} changed in the part this run "
                     r"has already read \({'records': 8"):
    fresh = make()
    fresh.set_state(state)
    next(fresh)
  with pytest.raises(ValueError, match=rf"data shard {first} has \d+ bytes, but this run "
                     r"read it to its end when it had \d+"):
    make().set_state(later)


def test_skipped_records_are_counted_once_across_restores(tmp_path):
  """The count of skipped bad records is part of the position: a restore neither loses nor
  recounts the skips of windows read before the checkpoint, with reading ahead or not."""
  path = tmp_path / "bad.jsonl"
  path.write_bytes(b"".join(_lines(60, bad=(2, 9, 10, 33))))
  make = lambda prefetch: stream.ShardBatches(  # noqa: E731
      [path], TOK, 8, 2, window=4, prefetch=prefetch, skip_bad=True,
      skips=shards.Skips(stream=False))
  counts = []
  it = make(0)
  for _ in range(100):
    next(it)
    counts.append(it.get_state()["skipped"])
  assert counts[0] == 1 and counts == sorted(counts) and counts[-1] > 4  # each reading
  for k in (1, 5, 17):
    before = make(2)
    take(before, k)
    fresh = make(2)
    fresh.set_state(json.loads(json.dumps(before.get_state())))
    got = []
    for _ in range(100 - k):
      next(fresh)
      got.append(fresh.get_state()["skipped"])
    assert got == counts[k:], k
