"""Data pipeline: tfds streaming batches (exact packing, processes), the factory.

The shard sources are tested in tests/data/test_shards.py, prepared data in
tests/data/test_prepare.py, ``tfds_source`` without tfds (resuming, its errors) in
tests/data/test_tfds_source.py."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from fp8jax.data import packing, pipeline, shards, sources, tfds_source, tokenizers

tfds = pytest.importorskip("tensorflow_datasets")
grain = pytest.importorskip("grain")

TOK = tokenizers.ByteTokenizer()
# Documents of many lengths (an empty one, some longer than a whole batch), non-ASCII too.
DOCS = [f"doc {i}: " + "naïve ü, " * (i % 5) + "x" * (3 * i % 11) for i in range(37)]
DOCS[5] = ""
DOCS[11] = "a long one " * 12


class Fp8jaxTestDocs(tfds.core.GeneratorBasedBuilder):
  """A tiny text dataset, prepared as ArrayRecord without TensorFlow."""

  VERSION = tfds.core.Version("1.0.0")
  code_path = None  # no download checksums to look up next to this module

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    for i, text in enumerate(DOCS):
      yield i, {"text": text}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tfds")
  Fp8jaxTestDocs(data_dir=str(path), file_format="array_record").download_and_prepare()
  return str(path)


def texts_of(name, data_dir=None):
  """The dataset's documents in record order, read straight from tfds."""
  if name.startswith("c4"):
    import tensorflow_datasets.text.c4  # noqa: F401
  records = tfds.data_source(name, split="train", data_dir=data_dir, download=False)
  texts = [records[i]["text"] for i in range(len(records))]
  return [t.decode() if isinstance(t, bytes) else t for t in texts]


def reference(texts, seq_len, local_rows, steps, seed=0, p=0, procs=1):
  """The documented order and packing, recomputed: int32 [steps, local_rows, seq_len]."""
  n, stream, epoch = len(texts), [], 0
  while len(stream) < steps * local_rows * seq_len:
    s = int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])
    order = [grain.experimental.index_shuffle(i, max_index=n - 1, seed=s, rounds=4)
             for i in range(n)]
    assert sorted(order) == list(range(n))
    for k in range(n // procs):
      stream += list(TOK.encode(texts[order[k * procs + p]])) + [TOK.eos_id]
    epoch += 1
  return np.asarray(stream[:steps * local_rows * seq_len], np.int32).reshape(
      steps, local_rows, seq_len)


def take(it, steps):
  """int32 [steps, rows, seq_len]: the next ``steps`` batches (steps >= 1)."""
  batches = [next(it) for _ in range(steps)]
  return np.stack(batches) if batches else np.zeros((0,), np.int32)


def test_tfds_batches_match_reference_across_epochs(data_dir):
  texts = texts_of("fp8jax_test_docs", data_dir)
  assert sorted(texts) == sorted(DOCS)
  steps = 45  # ~2.3 epochs of 4 x 16-token batches
  it = pipeline.make_batches("tfds:fp8jax_test_docs", TOK, seq_len=16, global_batch=4, seed=3,
                             data_dir=data_dir)
  got = take(it, steps)
  assert got.dtype == np.int32 and got.shape == (steps, 4, 16)
  np.testing.assert_array_equal(got, reference(texts, 16, 4, steps, seed=3))
  assert it.get_state()["epoch"] >= 2
  # Reading in the calling thread gives the same batches; another seed another order.
  docs = tfds_source.tfds_source("fp8jax_test_docs", data_dir=data_dir)
  sync = tfds_source.StreamingBatches(docs, TOK, 16, 4, seed=3, read_threads=0)
  np.testing.assert_array_equal(take(sync, steps), got)
  other = tfds_source.StreamingBatches(docs, TOK, 16, 4, seed=4)
  assert not np.array_equal(take(other, 5), got[:5])


def test_mock_c4_batches_match_reference():
  with tfds.testing.mock_data(num_examples=48):
    texts = texts_of("c4/en:3.1.0")
    it = pipeline.make_batches("tfds:c4/en:3.1.0", TOK, seq_len=8, global_batch=4, seed=7)
    np.testing.assert_array_equal(take(it, 20), reference(texts, 8, 4, 20, seed=7))
    with pytest.raises(KeyError, match=r"no field 'body'; available: \[.*'text'.*'url'\]"):
      pipeline.make_batches("tfds:c4/en:3.1.0", TOK, 8, 4, field="body")


def test_processes_read_disjoint_deterministic_streams(data_dir):
  # Per-process streams: process p of P packs positions p, p + P, ... of each permutation.
  texts = texts_of("fp8jax_test_docs", data_dir)
  for p in range(2):
    it = pipeline.make_batches("tfds:fp8jax_test_docs", TOK, 16, 4, seed=1, process_index=p,
                               process_count=2, data_dir=data_dir)
    np.testing.assert_array_equal(take(it, 25), reference(texts, 16, 2, 25, seed=1, p=p,
                                                          procs=2))
  # Disjoint documents, read back from the batches themselves (21 docs: 1 skipped per epoch).
  docs = [f"<{i}>" + "y" * (i % 7) for i in range(21)]
  epoch0 = []
  for p in range(2):
    runs = [take(tfds_source.StreamingBatches(docs, TOK, 8, 2, seed=2, process_index=p,
                                              process_count=2), 12) for _ in range(2)]
    np.testing.assert_array_equal(runs[0], runs[1])
    stream = TOK.decode(np.where(runs[0].ravel() == TOK.eos_id, ord("|"), runs[0].ravel()))
    epoch0.append(stream.split("|")[:10])
  assert len(set(epoch0[0]) | set(epoch0[1])) == 20 and set(epoch0[0]) <= set(docs)
  with pytest.raises(ValueError, match="not divisible by the 3 processes"):
    tfds_source.StreamingBatches(docs, TOK, 8, 4, process_count=3)


def test_errors_name_the_problem(data_dir, tmp_path):
  with pytest.raises(ValueError,
                     match=r"unknown data source 'c4'.*'embedded', 'synthetic:<MB>', 'files'"):
    pipeline.make_batches("c4", TOK, 16, 4)
  with pytest.raises(ValueError, match="unknown data source 'tfds:'"):
    pipeline.validate("tfds:")
  with pytest.raises(ValueError, match="'files' needs at least one path"):
    pipeline.make_batches("files", TOK, 16, 4)
  with pytest.raises(FileNotFoundError, match="no data shard matches .*nope.txt"):
    pipeline.validate("files", paths=(str(tmp_path / "nope.txt"),))
  missing = str(tmp_path / "no_such_dir")
  with pytest.raises(FileNotFoundError, match=f"data_dir {missing} does not exist"):
    pipeline.make_batches("tfds:c4/en:3.1.0", TOK, 16, 4, data_dir=missing)
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError,
                     match=rf"'c4/en:3.1.0'.*not prepared.*{empty}.*tfds build c4/en"):
    pipeline.validate("tfds:c4/en:3.1.0", data_dir=str(empty))
  with pytest.raises(ValueError, match="tfds has no dataset 'no_such_dataset_xyz'"):
    pipeline.validate("tfds:no_such_dataset_xyz", data_dir=str(empty))
  with pytest.raises(KeyError, match=r"no field 'content'; available: \['text'\]"):
    pipeline.validate("tfds:fp8jax_test_docs", data_dir=data_dir, field="content")
  pipeline.validate("tfds:fp8jax_test_docs", data_dir=data_dir)
  pipeline.check_vocab(TOK, 257)
  with pytest.raises(ValueError, match="needs 257 token ids .* has only 256"):
    pipeline.check_vocab(TOK, 256)
  with pytest.raises(ValueError, match=r"needs 301 token ids \(vocab_size 257, eos_id 300\)"):
    pipeline.check_vocab(tokenizers.ByteTokenizer(eos_id=300), 300)


@pytest.fixture(scope="module")
def without_optional_packages(tmp_path_factory):
  """What a child process in which tensorflow_datasets, grain and TensorFlow do not import
  reports (one child for the tests that need one: each child spends seconds importing JAX):
  ``{"tfds": pipeline.validate('tfds:c4/en')'s ImportError, "tfrecord": a TFRecord file's
  make_batches's}`` (None where the call raised none)."""
  path = tmp_path_factory.mktemp("tfrecord") / "c4-train.tfrecord-00000-of-00001"
  path.write_bytes(b"")
  code = ("import json, sys\n"
          "for name in ('tensorflow_datasets', 'grain', 'tensorflow'):\n"
          "  sys.modules[name] = None\n"
          "from fp8jax.data import pipeline, tfds_source, tokenizers\n"
          "calls = {'tfds': lambda: pipeline.validate('tfds:c4/en'),\n"
          "         'tfrecord': lambda: pipeline.make_batches(\n"
          f"             'files', tokenizers.ByteTokenizer(), 8, 2, paths=({str(path)!r},))}}\n"
          "out = {}\n"
          "for name, call in calls.items():\n"
          "  try:\n    call()\n    out[name] = None\n"
          "  except ImportError as e:\n    out[name] = str(e)\n"
          "print(json.dumps(out))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True).stdout
  return json.loads(out.splitlines()[-1])


def test_missing_packages_are_reported_and_not_imported_eagerly(without_optional_packages):
  assert ("needs tensorflow_datasets: pip install fp8jax[data]"
          in str(without_optional_packages["tfds"]))


def test_in_memory_sources_match_batch_iterator(tmp_path):
  want = packing.BatchIterator(packing.pack(sources.embedded_corpus(), TOK, 64), 8, seed=2,
                               process_index=1, process_count=2)
  got = pipeline.make_batches("embedded", TOK, 64, 8, seed=2, process_index=1, process_count=2)
  assert isinstance(got.batches, packing.BatchIterator)
  np.testing.assert_array_equal(take(got, 5), take(want, 5))
  assert got.get_state()["data"].startswith("embedded:")
  # "files" streams its shards (tests/data/test_shards.py); one window of one shard here
  # packs the non-empty documents in their window permutation.
  (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"body": d}) for d in DOCS))
  files = pipeline.make_batches("files", TOK, 16, 4, paths=(str(tmp_path / "a.jsonl"),),
                                field="body")
  order = np.random.default_rng([0, 0, 0, 0]).permutation(len(DOCS) - 1)
  kept = [d for d in DOCS if d]
  want = packing.BatchIterator(packing.pack([kept[i] for i in order], TOK, 16), 4)
  want.set_state({"epoch": 0, "step": 0})
  stream_ = np.concatenate([t.ravel() for t in take(files, 5)])
  np.testing.assert_array_equal(stream_, want.sequences.ravel()[:len(stream_)])


def test_tfrecord_c4_streams_through_tensorflow(tmp_path):
  """The prepared tfds C4 is TFRecord: read through the ``tf`` extra, as shards."""
  pytest.importorskip("tensorflow", reason="TFRecord sources need the tf extra "
                      "(tensorflow-cpu), which CI does not install")
  data_dir = str(tmp_path / "tfds")
  Fp8jaxTestDocs(data_dir=data_dir, file_format="tfrecord").download_and_prepare()
  files = tfds_source.tfds_source("fp8jax_test_docs", data_dir=data_dir)
  assert isinstance(files, list) and all(".tfrecord" in f for f in files)
  it = pipeline.make_batches("tfds:fp8jax_test_docs", TOK, 16, 4, seed=1, data_dir=data_dir)
  assert it.get_state()["data"].startswith("files:")
  texts = []
  for f in files:
    with shards.ShardReader(f) as reader:
      texts += [t for _, t in reader]
  assert sorted(texts) == sorted(d for d in DOCS if d)
  got = take(it, 40)
  assert got.shape == (40, 4, 16)
  flat = TOK.decode(np.where(got.ravel() == TOK.eos_id, ord("|"), got.ravel())).split("|")
  assert set(flat[1:-1]) <= set(DOCS)


def test_tfrecord_without_tensorflow_says_how_to_install(without_optional_packages):
  assert ("needs TensorFlow: pip install fp8jax[tf] (tensorflow-cpu)"
          in str(without_optional_packages["tfrecord"]))
