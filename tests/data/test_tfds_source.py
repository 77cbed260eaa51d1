"""``fp8jax.data.tfds_source`` without tensorflow-datasets: ``TextSource``, the errors and
the TFRecord fallback of ``tfds_source`` against a stand-in tfds module, ``epoch_seed``, and
``StreamingBatches`` over in-memory documents (exact order and packing, resume, its
checks). The real tfds path is tested in tests/data/test_pipeline.py."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from fp8jax.data import tfds_source, tokenizers

TOK = tokenizers.ByteTokenizer()
# Documents of many lengths (an empty one, some longer than a whole batch), non-ASCII too.
DOCS = [f"doc {i}: " + "naïve ü, " * (i % 5) + "x" * (3 * i % 11) for i in range(37)]
DOCS[5] = ""
DOCS[11] = "a long one " * 12


class DatasetNotFoundError(Exception):
  pass


def fake_tfds(monkeypatch, data_source=None, builder=None, c4=False):
  """Installs a stand-in ``tensorflow_datasets`` module; returns the calls it saw."""
  calls = []
  module = types.ModuleType("tensorflow_datasets")
  module.core = types.SimpleNamespace(
      registered=types.SimpleNamespace(DatasetNotFoundError=DatasetNotFoundError))

  def source(name, **kwargs):
    calls.append((name, kwargs))
    return data_source(name) if callable(data_source) else data_source
  module.data_source = source
  module.builder = builder or (lambda name, data_dir=None: (_ for _ in ()).throw(KeyError(name)))
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", module)
  if not c4:  # no c4 builders, even if the real ones were imported earlier in the process
    monkeypatch.setitem(sys.modules, "tensorflow_datasets.text", None)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets.text.c4", None)
  else:
    module.__path__ = []
    text = types.ModuleType("tensorflow_datasets.text")
    text.__path__ = []
    monkeypatch.setitem(sys.modules, "tensorflow_datasets.text", text)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets.text.c4",
                        types.ModuleType("tensorflow_datasets.text.c4"))
  return calls


def raising(error):
  def f(name):
    raise error
  return f


def take(it, steps):
  return np.stack([next(it) for _ in range(steps)])


# --- TextSource --------------------------------------------------------------------


def test_text_source_reads_the_field_as_str():
  records = [{"text": "plain", "url": "u"}, {"text": b"na\xc3\xafve \xff"}, {"text": 42}]
  source = tfds_source.TextSource(records, name="mine")
  assert len(source) == 3
  assert [source[i] for i in range(3)] == ["plain", "naïve \ufffd", "42"]
  assert repr(source) == "TextSource(mine, field='text', 3 documents)"
  assert tfds_source.TextSource([{"body": "b"}], field="body")[0] == "b"


def test_text_source_names_the_missing_field_and_the_keys_there_are():
  source = tfds_source.TextSource([{"text": "a"}, {"url": "u", "body": "b"}], name="c4[train]")
  with pytest.raises(KeyError, match=r"c4\[train\]: record 1 has no field 'text'; "
                                     r"available: \['body', 'url'\]"):
    source[1]  # noqa: B018
  with pytest.raises(KeyError, match="record 0 has no field 'text'; available: list"):
    tfds_source.TextSource([["a", "b"]])[0]  # noqa: B018


# --- tfds_source, with tfds missing or stood in for ---------------------------------


def test_without_tfds_the_error_names_the_extra_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  with pytest.raises(ImportError, match=r"streaming tfds data needs tensorflow_datasets: "
                                        r"pip install fp8jax\[data\]"):
    tfds_source.tfds_source("c4/en:3.1.0")


def test_a_missing_data_dir_is_named_before_tfds_is_imported(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  missing = tmp_path / "nope"
  with pytest.raises(FileNotFoundError, match=f"tfds data_dir {missing} does not exist"):
    tfds_source.tfds_source("c4/en:3.1.0", data_dir=str(missing))


def test_opens_the_prepared_split_without_downloading(monkeypatch, tmp_path):
  calls = fake_tfds(monkeypatch, data_source=[{"text": "one"}, {"text": "two"}])
  source = tfds_source.tfds_source("wiki/en:1.0", split="validation", data_dir=str(tmp_path))
  assert calls == [("wiki/en:1.0", {"split": "validation", "data_dir": str(tmp_path),
                                    "download": False})]
  assert isinstance(source, tfds_source.TextSource)
  assert [source[0], source[1]] == ["one", "two"]
  assert source.name == "tfds wiki/en:1.0[validation]"


def test_c4_names_register_the_c4_builders_first(monkeypatch):
  fake_tfds(monkeypatch, data_source=[{"text": "t"}])
  with pytest.raises(ModuleNotFoundError, match="tensorflow_datasets.text"):
    tfds_source.tfds_source("c4/en:3.1.0")
  fake_tfds(monkeypatch, data_source=[{"text": "t"}], c4=True)
  assert tfds_source.tfds_source("c4/en:3.1.0")[0] == "t"


def test_an_unknown_dataset_is_a_value_error_naming_it(monkeypatch):
  fake_tfds(monkeypatch, data_source=raising(DatasetNotFoundError("not found: xyz\nmore")))
  with pytest.raises(ValueError, match=r"^tfds has no dataset 'xyz': not found: xyz$"):
    tfds_source.tfds_source("xyz")


@pytest.mark.parametrize("error", [FileNotFoundError("no files here\ndetail"),
                                   AssertionError("no files here"), OSError("no files here")])
def test_an_unprepared_dataset_says_where_and_how_to_prepare_it(monkeypatch, tmp_path, error):
  fake_tfds(monkeypatch, data_source=raising(error))
  with pytest.raises(FileNotFoundError) as e:
    tfds_source.tfds_source("wiki/en:1.0", data_dir=str(tmp_path))
  message = str(e.value)
  assert f"'wiki/en:1.0' (split 'train') is not prepared as ArrayRecord or TFRecord in " \
         f"data_dir {tmp_path}." in message
  assert f"`tfds build wiki/en --data_dir={tmp_path} --file_format=array_record`" in message
  assert message.endswith("tfds said: no files here")


def test_the_default_data_dir_is_named_in_the_error(monkeypatch):
  fake_tfds(monkeypatch, data_source=raising(FileNotFoundError("x")))
  monkeypatch.setenv("TFDS_DATA_DIR", "/data/tfds")
  with pytest.raises(FileNotFoundError, match="in data_dir /data/tfds. "):
    tfds_source.tfds_source("wiki")
  monkeypatch.delenv("TFDS_DATA_DIR")
  with pytest.raises(FileNotFoundError, match="in data_dir ~/tensorflow_datasets. "):
    tfds_source.tfds_source("wiki")


def _builder(file_format, files):
  info = types.SimpleNamespace(file_format=types.SimpleNamespace(value=file_format),
                               splits={"train": types.SimpleNamespace(filepaths=files)})
  return lambda name, data_dir=None: types.SimpleNamespace(info=info)


def test_a_tfrecord_dataset_gives_its_files_to_stream_as_shards(monkeypatch, tmp_path):
  files = [tmp_path / f"wiki-train.tfrecord-0000{i}-of-00002" for i in range(2)]
  for f in files:
    f.write_bytes(b"")
  fake_tfds(monkeypatch, data_source=raising(NotImplementedError("no random access")),
            builder=_builder("tfrecord", files))
  assert tfds_source.tfds_source("wiki") == [str(f) for f in files]
  files[1].unlink()
  with pytest.raises(FileNotFoundError,
                     match=rf"'wiki' lacks 1 of its train TFRecord files, e\.g\. {files[1]}"):
    tfds_source.tfds_source("wiki")


def test_tfrecord_files_is_empty_for_other_formats_and_unknown_splits(tmp_path):
  tfds = types.SimpleNamespace(builder=_builder("array_record", [str(tmp_path / "a")]))
  assert tfds_source.tfrecord_files(tfds, "wiki", "train", None) == []
  tfds = types.SimpleNamespace(builder=_builder("tfrecord", []))
  assert tfds_source.tfrecord_files(tfds, "wiki", "test", None) == []  # KeyError: no split

  def no_builder(name, data_dir=None):
    raise ValueError(name)
  assert tfds_source.tfrecord_files(types.SimpleNamespace(builder=no_builder), "w", "train",
                                    None) == []


def test_an_array_record_dataset_that_cannot_be_opened_is_not_prepared(monkeypatch):
  """NotImplementedError from a dataset that is not TFRecord either: FileNotFoundError."""
  fake_tfds(monkeypatch, data_source=raising(NotImplementedError("riegeli")),
            builder=_builder("riegeli", []))
  with pytest.raises(FileNotFoundError, match="not prepared .* tfds said: riegeli"):
    tfds_source.tfds_source("wiki")


def test_empty_splits_and_records_without_the_field_fail_when_opened(monkeypatch):
  fake_tfds(monkeypatch, data_source=[])
  with pytest.raises(ValueError, match=r"tfds wiki\[train\] holds no records"):
    tfds_source.tfds_source("wiki")
  fake_tfds(monkeypatch, data_source=[{"content": "c", "id": 1}])
  with pytest.raises(KeyError, match=r"no field 'text'; available: \['content', 'id'\]"):
    tfds_source.tfds_source("wiki")
  assert tfds_source.tfds_source("wiki", field="content")[0] == "c"


# --- epoch seeds and StreamingBatches ----------------------------------------------


def test_epoch_seeds_are_32_bit_and_distinct_per_seed_and_epoch():
  seeds = {(s, e): tfds_source.epoch_seed(s, e) for s in range(4) for e in range(50)}
  assert len(set(seeds.values())) == len(seeds)
  assert all(0 <= v < 2**32 and type(v) is int for v in seeds.values())
  assert tfds_source.epoch_seed(3, 7) == seeds[(3, 7)]  # a pure function
  assert tfds_source.epoch_seed(0, 1) != tfds_source.epoch_seed(1, 0)


def test_bad_layouts_and_seeds_are_refused_before_grain_is_imported(monkeypatch):
  monkeypatch.setitem(sys.modules, "grain", None)
  with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
    tfds_source.StreamingBatches(DOCS, TOK, 8, 4, seed=-1)
  with pytest.raises(ValueError, match="global batch 4 is not divisible by the 3 processes"):
    tfds_source.StreamingBatches(DOCS, TOK, 8, 4, process_count=3)
  with pytest.raises(ValueError, match="seq_len must be >= 2, got 1"):
    tfds_source.StreamingBatches(DOCS, TOK, 1, 4)
  with pytest.raises(ValueError, match=r"process_index 2 not in \[0, 2\)"):
    tfds_source.StreamingBatches(DOCS, TOK, 8, 4, process_index=2, process_count=2)
  with pytest.raises(ImportError, match=r"needs grain: pip install fp8jax\[data\]"):
    tfds_source.StreamingBatches(DOCS, TOK, 8, 4)


def reference(grain, texts, seq_len, local_rows, steps, seed=0, p=0, procs=1):
  """The documented order and packing, recomputed: int32 [steps, local_rows, seq_len]."""
  n, stream, epoch = len(texts), [], 0
  while len(stream) < steps * local_rows * seq_len:
    s = int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])
    order = [grain.experimental.index_shuffle(i, max_index=n - 1, seed=s, rounds=4)
             for i in range(n)]
    for k in range(n // procs):
      stream += list(TOK.encode(texts[order[k * procs + p]])) + [TOK.eos_id]
    epoch += 1
  return np.asarray(stream[:steps * local_rows * seq_len], np.int32).reshape(
      steps, local_rows, seq_len)


@pytest.mark.parametrize("p,procs,threads", [(0, 1, 2), (1, 2, 0)])
def test_batches_follow_the_documented_order_and_packing(p, procs, threads):
  grain = pytest.importorskip("grain")
  it = tfds_source.StreamingBatches(tfds_source.TextSource([{"text": d} for d in DOCS]), TOK,
                                    16, 4, seed=3, process_index=p, process_count=procs,
                                    read_threads=threads)
  got = take(it, 30)  # ~2 epochs
  assert got.dtype == np.int32 and got.shape == (30, 4 // procs, 16)
  np.testing.assert_array_equal(got, reference(grain, DOCS, 16, 4 // procs, 30, seed=3, p=p,
                                               procs=procs))
  assert it.get_state()["epoch"] >= 1


def test_too_few_documents_for_the_processes():
  pytest.importorskip("grain")
  with pytest.raises(ValueError, match="3 documents cannot be shared by 4 processes"):
    tfds_source.StreamingBatches(DOCS[:3], TOK, 8, 4, process_count=4)


@pytest.mark.parametrize("k", [0, 1, 9, 38])
def test_resume_reproduces_the_uninterrupted_run(k):
  pytest.importorskip("grain")
  docs = tfds_source.TextSource([{"text": d} for d in DOCS])
  make = lambda: tfds_source.StreamingBatches(docs, TOK, 12, 3, seed=5)  # noqa: E731
  full = take(make(), k + 12)
  it = make()
  if k:
    take(it, k)
  state = json.loads(json.dumps(it.get_state()))
  assert set(state) == {"seed", "epoch", "doc", "offset"}
  assert all(type(v) is int for v in state.values())
  fresh = make()
  fresh.set_state(state)
  np.testing.assert_array_equal(take(fresh, 12), full[k:])
  # The interrupted iterator itself goes on identically, too.
  np.testing.assert_array_equal(take(it, 12), full[k:])


def test_resume_states_include_mid_document_positions():
  pytest.importorskip("grain")
  docs = tfds_source.TextSource([{"text": d} for d in DOCS])
  it = tfds_source.StreamingBatches(docs, TOK, 12, 3, seed=5)
  states = [(next(it), it.get_state())[1] for _ in range(45)]
  assert any(s["offset"] > 0 for s in states) and any(s["epoch"] == 1 for s in states)
  with pytest.raises(ValueError, match="used seed 5, this run uses 6"):
    tfds_source.StreamingBatches(docs, TOK, 12, 3, seed=6).set_state(states[-1])
  with pytest.raises(ValueError, match="out of range"):
    it.set_state({"seed": 5, "epoch": 0, "doc": len(docs), "offset": 0})


def test_a_state_past_the_document_is_named_when_read():
  pytest.importorskip("grain")
  it = tfds_source.StreamingBatches(["ab", "cd"], TOK, 4, 1, read_threads=0)
  it.set_state({"seed": 0, "epoch": 0, "doc": 0, "offset": 3})  # "ab" + EOS: 3 tokens
  with pytest.raises(ValueError, match="offset 3 is past the 3 tokens of document 0"):
    next(it)
