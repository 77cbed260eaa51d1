"""The disk copy of packed sequences (fp8jax.data.packed_cache): the same sequences as
packing in memory, read back instead of packed again, and a damaged copy repacked with a
warning naming it."""

import itertools

import numpy as np
import pytest

from fp8jax.data import packed_cache, packing, pipeline, synthetic, tokenizers


def _docs(n=40):
  return list(itertools.islice(synthetic.corpus(0.05), n))


def test_second_start_reads_the_copy_and_a_damaged_copy_is_repacked(tmp_path, capsys):
  tok, calls = tokenizers.get_tokenizer("bytes"), []

  def pack():
    calls.append(1)
    return packing.pack(_docs(), tok, 16)

  first = packed_cache.packed(pack, "synthetic:abc", 16, tmp_path)
  again = packed_cache.packed(pack, "synthetic:abc", 16, tmp_path)
  np.testing.assert_array_equal(again, first)
  assert len(calls) == 1
  packed_cache.packed(pack, "synthetic:other", 16, tmp_path)  # other data: packed again
  assert len(calls) == 2 and len(list(tmp_path.glob("*.npy"))) == 2
  copy = tmp_path / f"{packed_cache._key('synthetic:abc', 16)}.npy"  # pylint: disable=protected-access
  raw = bytearray(copy.read_bytes())
  raw[-3] ^= 0xFF
  copy.write_bytes(bytes(raw))
  repacked = packed_cache.packed(pack, "synthetic:abc", 16, tmp_path)
  np.testing.assert_array_equal(repacked, first)
  assert len(calls) == 3 and str(copy) in capsys.readouterr().err
  assert not list(tmp_path.glob(".*"))  # no temporary files left


def test_the_synthetic_source_uses_the_cache_folder(tmp_path, monkeypatch):
  monkeypatch.setenv(packed_cache.ENV, str(tmp_path))
  tok = tokenizers.get_tokenizer("bytes")
  a = pipeline.make_batches("synthetic:0.05", tok, 16, 4)
  assert len(list(tmp_path.glob("*.npy"))) == 1
  monkeypatch.setattr(packing, "pack", lambda *a, **k: pytest.fail("packed again"))
  b = pipeline.make_batches("synthetic:0.05", tok, 16, 4)
  for _ in range(3):
    np.testing.assert_array_equal(next(a), next(b))
  assert a.data == b.data
