"""fp8jax.data.stream: batches streamed from document shards in the documented order,
identical across restarts, disjoint across processes, resumed exactly from any position,
and a shard that may change only past what the run has read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fp8jax.data import shards, stream
from tests.data_fixtures import TOK, docs_of, take, write_c4


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
