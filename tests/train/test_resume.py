"""What a resume may change: a run stopped by a bad record goes on with
``data.skip_bad_records`` (counted in the metrics) or after the shard is repaired past
its data position; options that change the computation or the data read stay refused.
(The rules: docs/reliability.md, "What may change on resume".)"""

import io
import json
import shutil

import pytest

from fp8jax.data import shards, stream
from fp8jax.train import loop, metrics_log, run_config
from tests.data_fixtures import TOK

pytestmark = pytest.mark.slow


def write_shards(folder, bad_in: str | None) -> list:
  """Three JSON-lines shards of 40 documents; ``bad_in``: the one whose line 6 is bad."""
  folder.mkdir(exist_ok=True)
  paths = []
  for s in range(3):
    path = folder / f"shard-{s}.jsonl"
    lines = [json.dumps({"text": f"shard {s} document {i} " + "z" * (i % 9)})
             for i in range(40)]
    if path.name == bad_in:
      lines[5] = '{"text": 5}'
    path.write_text("\n".join(lines) + "\n")
    paths.append(path)
  return paths


def config(folder, steps=12):
  c = run_config.defaults()
  c.data.source, c.data.paths = "files", (str(folder),)
  c.data.seq_len, c.data.global_batch = 32, 4
  c.optim.peak_lr, c.optim.warmup_steps, c.optim.total_steps = 3e-3, 2, 12
  c.train.steps, c.train.save_every, c.train.log_every = steps, 2, 1
  return c


def rows(workdir):
  return metrics_log.read_rows(workdir / "metrics.jsonl")


def test_a_run_stopped_by_a_bad_record_resumes_with_skipping_or_a_repaired_shard(tmp_path):
  data = tmp_path / "data"
  paths = write_shards(data, None)
  second = paths[stream.ShardBatches(paths, TOK, 32, 4).my_shards(0)[1]].name
  write_shards(data, second)  # the second shard of the order has a bad line 6
  run = tmp_path / "run"
  with pytest.raises(shards.BadRecordError, match=rf"{second}:6: field 'text' is int"):
    loop.train(config(data), run)
  stopped = max(r["step"] for r in rows(run))
  assert 2 <= stopped < 12

  skipping = shutil.copytree(run, tmp_path / "skipping")
  c = config(data)
  c.data.skip_bad_records, c.train.log_every = True, 2  # neither changes what was read
  out = io.StringIO()
  loop.train(c, skipping, resume=True, stream=out)
  assert "--resume changes data.skip_bad_records: False -> True" in out.getvalue()
  counts = [(r["step"], r["skipped_records"]) for r in rows(skipping)]
  assert counts[-1] == (12, 1) and counts[0] == (1, 0)

  write_shards(data, None)  # repaired, past the run's position
  loop.train(config(data), run, resume=True, stream=io.StringIO())
  fresh = tmp_path / "fresh"
  loop.train(config(data), fresh, stream=io.StringIO())
  assert [(r["step"], r["loss"]) for r in rows(run)] == [
      (r["step"], r["loss"]) for r in rows(fresh)]

  with pytest.raises(ValueError, match=r"differs from .* in \['data.seed'\]; only "
                     "data.skip_bad_records, train.save_every"):
    c = config(data, steps=14)
    c.data.seed = 1
    loop.train(c, run, resume=True)
