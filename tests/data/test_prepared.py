"""fp8jax.data.prepared: a prepared folder's checks, an empty one named in one line and
``verify`` reading every record and naming a damaged file."""

from __future__ import annotations

import json

import pytest

from fp8jax.data import prepared
from tests.data.test_prepare import _damage_middle, prepare_quietly
from tests.data_fixtures import write_c4

pytest.importorskip("array_record", reason="prepared data needs array-record (data extra)")


def test_a_prepared_folder_without_documents_is_named_in_one_line(tmp_path):
  manifest = {"format": prepared.FORMAT, "complete": True, "field": "text", "dtype": "<i4",
              "tokenizer": {"fingerprint": "f", "eos_id": 0}, "sources": [], "files": [],
              "documents": 0}
  manifest["hash"] = prepared.manifest_hash(manifest)
  (tmp_path / prepared.MANIFEST).write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match=r"holds no documents \(were its sources empty\?\)"):
    prepared.PreparedDocs(tmp_path)


def test_verify_data_reads_every_record_and_names_a_damaged_file(tmp_path):
  write_c4(tmp_path / "c4", shards_n=2, docs_n=40)
  out = tmp_path / "prep"
  m = prepare_quietly([str(tmp_path / "c4" / "*.json.gz")], out, "bytes", workers=1)
  assert prepared.verify(out) == [(f["name"], "ok") for f in m["files"]]
  _damage_middle(out / m["files"][1]["name"])
  prepared.read_manifest(out)  # sizes and hash still agree
  (first, ok), (second, bad) = prepared.verify(out)
  assert (first, ok) == (m["files"][0]["name"], "ok") and second == m["files"][1]["name"]
  assert bad.startswith("corrupt: "), bad
  # Training meets the damage as a one-line error that names the folder and verify.
  with pytest.raises(ValueError, match=r"prep: its token files do not open .*verify --data="):
    prepared.PreparedDocs(out)
