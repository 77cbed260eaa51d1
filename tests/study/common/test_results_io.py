"""Results files (metrics.jsonl, sweep rows and details, branch lines): a torn last line is
repaired, a damaged line elsewhere is an error naming file and line, and a row whose
details line is missing is recomputed by the next sweep."""

import json
import shutil

import pytest

from fp8jax.study.common import results_io
from fp8jax.study.comparison import sweep
from fp8jax.train import loop, metrics_log, run_config

WINDOWS = sweep.Windows(offsets=(0,), batches=2, batch_size=4, seq_len=16)


def write_lines(path, lines):
  path.write_text("".join(f"{line}\n" for line in lines))


def test_a_torn_last_line_is_repaired_and_a_damaged_one_is_named(tmp_path):
  path = tmp_path / "rows.jsonl"
  write_lines(path, ['{"step": 1}', '{"step": 2}'])
  path.write_text(path.read_text() + '{"step": 3, "lo')  # a kill mid-write
  assert results_io.repair(path) == [{"step": 1}, {"step": 2}]
  assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
  write_lines(path, ['{"step": 1}', '{"step": 2, "lo', '{"step": 3}'])
  before = path.read_text()
  for read in (results_io.repair, metrics_log.read_rows):
    with pytest.raises(ValueError, match=rf"{path}:2: not a JSON object"):
      read(path)
  assert path.read_text() == before  # nothing dropped


@pytest.mark.slow
def test_resume_refuses_a_damaged_metrics_line(train_run, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(train_run, workdir)
  log = workdir / "metrics.jsonl"
  lines = log.read_text().splitlines()
  write_lines(log, ["garbage", *lines[1:]])
  cfg = run_config.load_saved(workdir, "--workdir")
  with pytest.raises(ValueError, match=r"metrics.jsonl:1: not a JSON object"):
    loop.train(cfg, workdir, resume=True)
  assert log.read_text().splitlines()[1:] == lines[1:]


@pytest.mark.slow
def test_a_missing_details_line_is_recomputed_and_a_damaged_one_named(train_run, tmp_path):
  out = tmp_path / "cmp"
  run = lambda: sweep.run(train_run, out, policies=["bf16"], steps=[4],  # noqa: E731
                          windows=WINDOWS, floor=False, telemetry=False)
  assert run()["rows_written"] == 2
  rows, details = out / "rows.jsonl", out / "details.jsonl"
  full = details.read_text().splitlines()
  write_lines(details, full[1:])  # the first row's details line is lost
  assert run()["rows_written"] == 1
  again = details.read_text().splitlines()
  assert sorted(again) == sorted(full)
  assert len(results_io.read(rows)) == 2  # recomputed, not duplicated
  write_lines(details, ["{not json", *again[1:]])
  with pytest.raises(ValueError, match=r"details.jsonl:1: not a JSON object"):
    run()
  assert json.loads(rows.read_text().splitlines()[0])["policy"] == "bf16"


def test_a_resumed_meta_must_agree_on_its_keys(tmp_path):
  """The one meta.json check of the sweep and the branch runs: the keys compared as JSON,
  an optional key absent from an older file passes, a differing one is named."""
  assert results_io.resumed_meta(tmp_path, {"k": 1}, ("k",), "runs") is None
  results_io.write_json(tmp_path / "meta.json", {"k": [1, 2], "steps": [1]})
  meta = {"k": (1, 2), "data": "c4"}
  assert results_io.resumed_meta(tmp_path, meta, ("k", "data"), "runs",
                                 optional=("data",))["steps"] == [1]
  with pytest.raises(ValueError, match=f"{tmp_path} holds runs with a different data"):
    results_io.resumed_meta(tmp_path, meta, ("k", "data"), "runs")
  with pytest.raises(ValueError, match=r"different k \(\[1, 2\] vs \[1, 3\]\); use another"):
    results_io.resumed_meta(tmp_path, {"k": [1, 3]}, ("k",), "runs")


@pytest.mark.parametrize("text,error", [
    ('{"policies": {}, "steps": [0],\n  "windows": }', r"meta.json:2:\d+: not valid JSON"),
    ('["policies", "steps"]', "holds a JSON list, not an object"),
    ('{"policies": {}}', r"lacks \['steps'\]")])
def test_a_damaged_meta_json_is_named_with_its_line(tmp_path, text, error):
  from fp8jax.study.branches import trajectory  # pylint: disable=import-outside-toplevel
  from fp8jax.study.common import results  # pylint: disable=import-outside-toplevel

  (tmp_path / "meta.json").write_text(text)
  for name in ("rows", "details", "baseline", "weights", "branches"):
    (tmp_path / f"{name}.jsonl").touch()
  with pytest.raises(ValueError, match=error):
    results.load(tmp_path)
  if "JSON" in error:  # a resumed sweep or branch run, and the branch lines' reader
    with pytest.raises(ValueError, match=error):
      results_io.resumed_meta(tmp_path, {"policies": {}}, ("policies",), "a sweep")
    with pytest.raises(ValueError, match=error):
      trajectory.load_branches(tmp_path)


def test_a_figure_killed_mid_write_leaves_the_previous_file(tmp_path):
  """save_figure writes beside the file and renames: a failure mid-write (a kill, a full
  disk) leaves the previous figure whole and no partial file behind."""
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

  path = tmp_path / "fig.png"
  fig = Figure(figsize=(2, 2))
  fig.add_subplot().plot([0, 1], [1, 0])
  results_io.save_figure(fig, path)
  before = path.read_bytes()
  assert before.startswith(b"\x89PNG")

  class Torn(Figure):
    def savefig(self, fname, **kwargs):
      with open(fname, "wb") as f:
        f.write(before[:20])
      raise OSError(28, "No space left on device")

  with pytest.raises(OSError, match="No space left"):
    results_io.save_figure(Torn(), path)
  assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]
