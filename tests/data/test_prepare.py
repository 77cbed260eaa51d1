"""Prepared data (fp8jax.data.prepare, prepared): manifest, records, resume after a kill,
bad records, training from the folder, the data a run used and the sweep's refusal (the
folder's own checks: ``tests/data/test_prepared.py``)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from fp8jax.data import pipeline, prepare, prepared, shards, tfds_source
from tests.data_fixtures import TOK, take, write_c4

pytest.importorskip("array_record", reason="prepared data needs array-record (data extra)")


def prepare_quietly(*args, **kwargs):
  with open(os.devnull, "w") as log:
    return prepare.prepare(*args, log=log, **kwargs)


def test_manifest_and_records(tmp_path):
  files = write_c4(tmp_path / "c4", shards_n=4, docs_n=23)
  out = tmp_path / "prep"
  m = prepare_quietly([str(tmp_path / "c4" / "*.json.gz")], out, "bytes", workers=1)
  paths = sorted((tmp_path / "c4").iterdir())
  docs = [d for name in sorted(files) for d in files[name] if d]
  assert [s["name"] for s in m["sources"]] == [p.name for p in paths]
  for s, p in zip(m["sources"], paths):
    assert s["bytes"] == p.stat().st_size
    assert s["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert s["records"] == 23 and s["documents"] == 22 and s["skipped"] == 0
  assert m["tokenizer"] == {"spec": "bytes", "fingerprint": "bytes", "vocab_size": 257,
                            "eos_id": 256}
  assert m["documents"] == len(docs)
  assert m["tokens"] == sum(len(d.encode("utf-8")) for d in docs)
  assert m["dtype"] == "uint16" and m["hash"] == prepared.manifest_hash(m)
  assert json.loads((out / "manifest.json").read_text()) == m
  got = prepared.PreparedDocs(out)
  assert len(got) == len(docs)
  assert [TOK.decode(got[i]) for i in range(len(got))] == docs
  # Plain ArrayRecord: grain's data source reads the same records.
  grain = pytest.importorskip("grain")
  source = grain.sources.ArrayRecordDataSource([str(out / f["name"]) for f in m["files"]])
  assert np.frombuffer(source[5], "<u2").tolist() == list(docs[5].encode("utf-8"))
  # A rerun finds it done; another tokenizer or input is refused in the same folder.
  assert prepare_quietly([str(tmp_path / "c4")], out, "bytes", workers=1) == m
  write_c4(tmp_path / "c4b", shards_n=3)
  with pytest.raises(ValueError, match="holds a preparation of other inputs"):
    prepare_quietly([str(tmp_path / "c4b")], out, "bytes")
  # The manifest is checked against the files on disk.
  (out / m["files"][1]["name"]).write_bytes(b"x")
  with pytest.raises(ValueError, match=r"00001.array_record: 1 bytes, the manifest says"):
    prepared.PreparedDocs(out)


def test_interrupted_preparation_resumes_without_duplicates(tmp_path):
  """A bad record stops the job after 2 of 5 units; leftovers of a kill are planted; the
  fixed rerun gives exactly the uninterrupted result."""
  src = tmp_path / "src"
  src.mkdir()
  lines = {i: [json.dumps({"text": f"shard {i} doc {j} " + "y" * j}) for j in range(30)]
           for i in range(5)}
  for i, ls in lines.items():
    (src / f"part-{i}.jsonl").write_text("\n".join(ls) + "\n")
  clean = prepare_quietly([str(src)], tmp_path / "clean", "bytes", workers=1)
  good = (src / "part-2.jsonl").read_bytes()
  (src / "part-2.jsonl").write_bytes(good.replace(b"doc 7 ", b"doc 7\xff", 1))  # same size
  out = tmp_path / "out"
  with pytest.raises(shards.BadRecordError, match=r"part-2.jsonl:8: byte 0xff at column"):
    prepare_quietly([str(src)], out, "bytes", workers=1)
  assert sorted(p.name for p in (out / "tokens").glob("*.json")) == ["00000.json",
                                                                    "00001.json"]
  assert not (out / "manifest.json").exists()
  (out / "tokens" / "00003.array_record.tmp").write_bytes(b"torn")  # killed mid-unit
  (out / "tokens" / "00004.array_record").write_bytes(b"stale")  # killed between renames
  with pytest.raises(FileNotFoundError, match="unfinished preparation"):
    prepared.PreparedDocs(out)
  (src / "part-2.jsonl").write_bytes(good)
  resumed = prepare_quietly([str(src)], out, "bytes", workers=1)
  assert resumed["hash"] == clean["hash"] and resumed["documents"] == 150
  assert not list((out / "tokens").glob("*.tmp"))
  a, b = prepared.PreparedDocs(tmp_path / "clean"), prepared.PreparedDocs(out)
  assert all(np.array_equal(a[i], b[i]) for i in range(len(a)))
  skipped = prepare_quietly([str(src / "part-1.jsonl")], tmp_path / "one", "bytes")
  assert skipped["skipped"]["count"] == 0
  (src / "part-1.jsonl").write_text("\n".join(lines[1][:5]) + '\n{"body": 1}\n' +
                                    "\n".join(lines[1][5:]) + "\n")
  m = prepare_quietly([str(src / "part-1.jsonl")], tmp_path / "skip", "bytes", skip_bad=True)
  assert m["skipped"]["count"] == 1 and m["documents"] == 30
  assert "part-1.jsonl:6: no field 'text'" in m["skipped"]["examples"][0]


@pytest.mark.slow
def test_killed_binary_resumes_to_the_same_data(tmp_path):
  write_c4(tmp_path / "c4", shards_n=12, docs_n=3000)
  args = [sys.executable, "-m", "fp8jax.experiments.prepare_data",
          f"--input={tmp_path / 'c4'}", "--workers=1"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  subprocess.run([*args, f"--out={tmp_path / 'full'}"], check=True, capture_output=True,
                 env=env, timeout=300)
  out = tmp_path / "killed"
  proc = subprocess.Popen([*args, f"--out={out}"], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 120
    while not (out / "tokens" / "00001.json").exists():
      assert proc.poll() is None and time.time() < deadline, "the job ended before the kill"
      time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.wait()
  assert not (out / "manifest.json").exists()
  done = subprocess.run([*args, f"--out={out}"], capture_output=True, text=True, env=env,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "ETA" in done.stderr and "done before" in done.stderr
  full = json.loads((tmp_path / "full" / "manifest.json").read_text())
  assert json.loads((out / "manifest.json").read_text())["hash"] == full["hash"]
  a, b = prepared.PreparedDocs(tmp_path / "full"), prepared.PreparedDocs(out)
  assert len(a) == len(b) == 12 * 2999
  assert all(np.array_equal(a[i], b[i]) for i in range(0, len(a), 97))


def test_prepared_batches_and_the_data_they_name(tmp_path):
  write_c4(tmp_path / "c4")
  out = tmp_path / "prep"
  m = prepare_quietly([str(tmp_path / "c4")], out, "bytes", workers=1)
  it = pipeline.make_batches("prepared", TOK, 16, 4, seed=2, data_dir=str(out))
  want = tfds_source.StreamingBatches(prepared.PreparedDocs(out), TOK, 16, 4, seed=2)
  np.testing.assert_array_equal(take(it, 30), take(want, 30))
  state = json.loads(json.dumps(it.get_state()))
  assert state["data"] == f"prepared:{m['hash']}"
  for p in range(2):  # disjoint per-process streams, as for tfds sources
    procs = pipeline.make_batches("prepared", TOK, 16, 4, seed=2, data_dir=str(out),
                                  process_index=p, process_count=2)
    assert procs.batches.process_index == p
  assert pipeline.override(str(out)) == {"source": "prepared", "data_dir": str(out)}
  assert pipeline.override("a/*.json.gz,b") == {"source": "files", "paths": ("a/*.json.gz", "b")}
  with pytest.raises(ValueError, match=r"tokenized with bytes \(bytes\); this run's "
                     "tokenizer is sha256:"):
    from fp8jax.data import bpe, tokenizers
    bpe.train_bpe([str(tmp_path / "c4")], tmp_path / "tok", vocab_size=300,
                  log=open(os.devnull, "w"))
    tok = tokenizers.get_tokenizer(str(tmp_path / "tok" / "tokenizer.json"))
    pipeline.make_batches("prepared", tok, 16, 4, data_dir=str(out))
  with pytest.raises(ValueError, match="'prepared' needs data_dir"):
    pipeline.validate("prepared")
  with pytest.raises(FileNotFoundError, match="not a prepared data folder"):
    pipeline.validate("prepared", data_dir=str(tmp_path / "c4"))


@pytest.mark.slow
def test_training_records_the_data_and_the_sweep_refuses_other_data(tmp_path, train_run):
  from fp8jax.study.comparison import eval_data, sweep
  from fp8jax.train import checkpoint, loop, run_config

  write_c4(tmp_path / "c4")
  out = tmp_path / "prep"
  m = prepare_quietly([str(tmp_path / "c4")], out, "bytes", workers=1)
  c = run_config.defaults()
  c.data.update(source="prepared", data_dir=str(out), seq_len=32, global_batch=4)
  c.optim.peak_lr, c.optim.warmup_steps, c.optim.total_steps = 3e-3, 1, 3
  c.train.steps, c.train.save_every, c.train.log_every = 2, 1, 1
  with open(os.devnull, "w") as log:
    loop.train(c, tmp_path / "run", stream=log)
    # A run saved before data.skip_bad_records existed resumes (missing keys: defaults).
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    del saved["data"]["skip_bad_records"]
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    c.train.steps = 3
    assert loop.train(c, tmp_path / "run", resume=True, stream=log)["final_step"] == 3
  ckpt = checkpoint.Checkpointer(tmp_path / "run" / "checkpoints", 1)
  try:
    assert eval_data._trained_on(ckpt, 2) == f"prepared:{m['hash']}"
    sweep.check_data(ckpt, [0, 1, 2, 3], f"prepared:{m['hash']}")
    with pytest.raises(ValueError, match=r"checkpoints \[0, 1, 2, 3\] were trained on data "
                       "prepared:.*allow_other_data"):
      sweep.check_data(ckpt, [0, 1, 2, 3], "files:0123")
    sweep.check_data(ckpt, [0, 1, 2, 3], "files:0123", allow_other_data=True)
  finally:
    ckpt.close()
  # The sweep over a run trained on the embedded corpus refuses the prepared data.
  with pytest.raises(ValueError, match="trained on data embedded:.* reads prepared:"):
    sweep.run(train_run, tmp_path / "cmp", policies=["bf16"],
              data=pipeline.override(str(out)))
  assert not (tmp_path / "cmp").exists()


def _damage_middle(path):
  """Flips the bytes of the file's middle third: the same size, so the manifest's checks
  pass."""
  data = bytearray(path.read_bytes())
  third = len(data) // 3
  data[third:2 * third] = bytes(b ^ 0xFF for b in data[third:2 * third])
  path.write_bytes(bytes(data))


@pytest.mark.slow
def test_verify_binary_on_a_prepared_folder(tmp_path):
  write_c4(tmp_path / "c4", shards_n=2, docs_n=20)
  out = tmp_path / "prep"
  m = prepare_quietly([str(tmp_path / "c4" / "*.json.gz")], out, "bytes", workers=1)
  run = lambda *a: subprocess.run(  # noqa: E731
      [sys.executable, "-m", "fp8jax.experiments.verify", *a], capture_output=True, text=True,
      timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  got = run(f"--data={out}")
  assert got.returncode == 0 and got.stdout.count(": ok\n") == 2, got.stderr
  _damage_middle(out / m["files"][0]["name"])
  got = run(f"--data={out}")
  assert got.returncode == 1 and "corrupt: " in got.stdout and "Traceback" not in got.stderr
  got = run(f"--data={tmp_path / 'nothing'}")
  assert got.returncode == 2 and got.stderr.count("\n") == 1, got.stderr


def test_a_full_disk_is_an_oserror_naming_the_file(tmp_path, monkeypatch):
  """The ArrayRecord writer's RuntimeError that quotes the system's 'No space left on
  device' becomes that OSError, which the binaries print as one line."""
  import errno  # pylint: disable=import-outside-toplevel

  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  from fp8jax.experiments import _cli  # pylint: disable=import-outside-toplevel

  real = array_record_module.ArrayRecordWriter

  class Full:
    def __init__(self, *args):
      self.writer = real(*args)

    def write(self, data):
      raise RuntimeError("FdWriter::Write() failed: No space left on device [system:28]")

    def close(self):
      self.writer.close()

  monkeypatch.setattr(array_record_module, "ArrayRecordWriter", Full)
  write_c4(tmp_path / "c4", shards_n=1, docs_n=5)
  with pytest.raises(OSError) as got:
    prepare_quietly([str(tmp_path / "c4")], tmp_path / "prep", "bytes", workers=1)
  assert got.value.errno == errno.ENOSPC
  assert _cli.message(got.value) == (f"{tmp_path}/prep/tokens/00000.array_record.tmp: "
                                     "no space left on device")
  assert prepare.disk_error(ValueError("other"), "x").args == ("other",)
