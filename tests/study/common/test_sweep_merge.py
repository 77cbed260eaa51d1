"""Parts of one sweep (each process over some policies or evaluation offsets) merge into the
sweep they split: fp8jax.study.common.results.merge / save, and report --results=A,B."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from fp8jax.study.common import results
from tests.study.test_sweep_report import REPO, build

FILES = ("rows", "details", "baseline", "weights")


def _split(whole: pathlib.Path, out: pathlib.Path, offsets=None, policies=None) -> pathlib.Path:
  """A part of ``whole``: its lines of ``offsets`` and ``policies`` (None: all)."""
  out.mkdir(parents=True)
  meta = json.loads((whole / "meta.json").read_text())
  if offsets is not None:
    meta["windows"]["offsets"] = list(offsets)
  if policies is not None:
    meta["policies"] = {k: v for k, v in meta["policies"].items() if k in policies}
  (out / "meta.json").write_text(json.dumps(meta))
  for name in FILES:
    keep = []
    for line in (whole / f"{name}.jsonl").read_text().splitlines():
      x = json.loads(line)
      if offsets is not None and "offset" in x and x["offset"] not in offsets:
        continue
      if policies is not None and "policy" in x and x["policy"] not in policies:
        continue
      keep.append(line + "\n")
    (out / f"{name}.jsonl").write_text("".join(keep))
  return out


def _same(a: results.Results, b: results.Results) -> None:
  assert a.meta == b.meta
  for name in FILES:
    got, want = (sorted(json.dumps(x, sort_keys=True) for x in getattr(r, name)) for r in (a, b))
    assert got == want, name


def test_offset_and_policy_parts_merge_into_the_whole(tmp_path):
  whole = build(tmp_path / "whole", floor=True, controls={"attn_l0-8_e4m3": (1, 1, 1, 1)})
  want = results.load(whole)
  by_offset = [_split(whole, tmp_path / f"o{o}", offsets=[o]) for o in (8, 0)]
  merged = results.merge([results.load(p) for p in by_offset])
  assert merged.meta["windows"]["offsets"] == [0, 8]
  _same(merged, want)
  names = list(want.meta["policies"])
  first = {"attn_l0-8_e4m3", "noise(attn_l0-8_e4m3)", "attn_l0_e4m3"}  # a control: with its policy
  by_policy = [_split(whole, tmp_path / "pa", policies=first),
               _split(whole, tmp_path / "pb", policies=set(names) - first)]
  _same(results.merge([results.load(p) for p in by_policy]), want)
  saved = results.save(merged, tmp_path / "saved")
  _same(results.load(saved), want)


def test_parts_of_other_runs_or_windows_are_refused(tmp_path):
  whole = build(tmp_path / "whole")
  a = _split(whole, tmp_path / "a", offsets=[0])
  b = _split(whole, tmp_path / "b", offsets=[8])
  meta = json.loads((b / "meta.json").read_text())
  for key, value, match in (("train_workdir", "/runs/other", "train_workdir"),
                            ("model", {"num_hidden_layers": 2}, "model"),
                            ("windows", {**meta["windows"], "batch_size": 4},
                             "evaluation windows"),
                            ("reference", {"precision": "fp32"}, "computes in FP32")):
    (b / "meta.json").write_text(json.dumps({**meta, key: value}))
    with pytest.raises(ValueError, match=match):
      results.merge([results.load(a), results.load(b)])
  with pytest.raises(ValueError, match="no sweeps"):
    results.merge([])
  # A part that recorded no reference precision (an older one) reads as BF16.
  (b / "meta.json").write_text(json.dumps({**meta, "reference": {"precision": "bf16"}}))
  assert results.merge([results.load(a), results.load(b)]).reference == "BF16"


@pytest.mark.slow
def test_report_binary_merges_parts(tmp_path):
  whole = build(tmp_path / "whole", floor=True)
  parts = [_split(whole, tmp_path / f"o{o}", offsets=[o]) for o in (0, 8)]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  run = lambda *args: subprocess.run(  # noqa: E731
      [sys.executable, "-m", "fp8jax.experiments.report", *args],
      capture_output=True, text=True, env=env, cwd=REPO, check=False)
  proc = run(f"--results={parts[0]},{parts[1]}")
  assert proc.returncode == 2 and "give --out" in proc.stderr
  proc = run(f"--results={parts[0]},{parts[1]}", f"--out={tmp_path / 'merged'}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "merged 2 parts" in proc.stdout
  proc = run(f"--results={whole}", f"--out={tmp_path / 'direct'}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  got = (tmp_path / "merged" / "report.md").read_text().splitlines()
  want = (tmp_path / "direct" / "report.md").read_text().splitlines()
  assert got[3:] == want[3:] and len(got) > 50  # all but the heading's folder
