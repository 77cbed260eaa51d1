"""Converted checkpoints on disk (``fp8jax.train.params_io``): HF -> Orbax by layer group
and back, the source hashes and array digests of ``meta.json``, existing outputs refused
unless overwritten, and a missing group refused by name."""

import hashlib
import json
import re
import shutil

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest

from fp8jax.models import config as mc
from fp8jax.models import deepseek_moe as dm
from fp8jax.models import hf_convert
from fp8jax.train import checkpoint_digest, params_io
from tests import helpers

SMALL = mc.tiny(dtype="float32", num_hidden_layers=2)  # a dense layer 0, an MoE layer 1
DENSE = mc.tiny(dtype="float32", num_hidden_layers=1)


def _bf16_params(cfg, seed):
  """Random params of ``cfg`` that bfloat16 holds exactly (an HF export keeps them), made
  with NumPy (a random init compiles a sampler per parameter shape: seconds)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda s: rng.standard_normal(s.shape).astype(ml_dtypes.bfloat16).astype(np.float32),
      dm.abstract_params(cfg))


def _hf(tmp_path, name, params, cfg=SMALL):
  hf_convert.params_to_hf(cfg, params, tmp_path / name, dtype=ml_dtypes.bfloat16)
  return tmp_path / name


def test_a_conversion_is_one_checkpoint_a_layer_group_and_loads_back_exactly(tmp_path):
  params = _bf16_params(SMALL, 0)
  got_cfg = params_io.hf_to_orbax(_hf(tmp_path, "hf", params), tmp_path / "ours")
  assert sorted(p.name for p in (tmp_path / "ours" / "params").iterdir()) == [
      "base", "layer_000", "layer_001"]
  cfg, loaded = params_io.load_params(tmp_path / "ours")
  assert cfg == got_cfg and cfg.num_hidden_layers == 2
  assert jax.tree.structure(loaded) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_a_missing_layer_group_is_refused_naming_the_params_folder(tmp_path):
  params_io.hf_to_orbax(_hf(tmp_path, "hf", _bf16_params(SMALL, 1)), tmp_path / "ours")
  shutil.rmtree(tmp_path / "ours" / "params" / "layer_001")
  folder = re.escape(str(tmp_path / "ours" / "params"))
  with pytest.raises(checkpoint_digest.IncompleteCheckpointError,
                     match=f"^checkpoint {folder} is incomplete: does not restore"):
    params_io.load_params(tmp_path / "ours")


def test_non_empty_outputs_are_refused_before_anything_is_read(tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  (out / "kept.txt").write_text("mine")
  absent = tmp_path / "absent"  # never read: the refusal comes first
  refusal = f"^{re.escape(str(out))} exists and is not empty; pass --overwrite to replace it$"
  with pytest.raises(FileExistsError, match=refusal):
    params_io.hf_to_orbax(absent, out)
  with pytest.raises(FileExistsError, match=refusal):
    params_io.orbax_to_hf(absent, out)
  assert [p.name for p in out.iterdir()] == ["kept.txt"]
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="config.json"):  # an empty folder is taken
    params_io.hf_to_orbax(absent, tmp_path / "empty")


def test_overwrite_replaces_the_whole_output_in_the_asked_param_dtype(tmp_path):
  params_io.hf_to_orbax(_hf(tmp_path, "hf_a", _bf16_params(DENSE, 2), DENSE),
                        tmp_path / "ours")
  (tmp_path / "ours" / "stale.txt").write_text("from before")
  second = _bf16_params(DENSE, 3)
  params_io.hf_to_orbax(_hf(tmp_path, "hf_b", second, DENSE), tmp_path / "ours",
                        overwrite=True, param_dtype="bfloat16")
  assert not (tmp_path / "ours" / "stale.txt").exists()
  cfg, loaded = params_io.load_params(tmp_path / "ours")
  assert cfg.param_dtype == "bfloat16"
  assert {leaf.dtype for leaf in jax.tree.leaves(loaded)} == {np.dtype(ml_dtypes.bfloat16)}
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a, np.float32), b),
               loaded, second)
  meta = json.loads((tmp_path / "ours" / "meta.json").read_text())
  assert meta["source"]["hf_dir"] == str((tmp_path / "hf_b").resolve())
  sources = [tmp_path / "hf_b" / "config.json", *sorted((tmp_path / "hf_b").glob("*.safetensors"))]
  assert meta["source"]["files"] == [
      {"name": f.name, "bytes": f.stat().st_size,
       "sha256": hashlib.sha256(f.read_bytes()).hexdigest()} for f in sources]
  assert not (tmp_path / "ours" / "meta.json.tmp").exists()


@pytest.mark.slow
def test_convert_binary_functions_round_trip(tmp_path):
  cfg = mc.tiny(dtype="float32")
  params = dm.init(cfg, jax.random.key(3))
  hf_convert.params_to_hf(cfg, params, tmp_path / "hf", dtype=ml_dtypes.bfloat16)
  got_cfg = params_io.hf_to_orbax(tmp_path / "hf", tmp_path / "ours", expert_pad_to=40)
  assert got_cfg.expert_width == 40
  groups = sorted(p.name for p in (tmp_path / "ours" / "params").iterdir())
  assert groups == ["base", "layer_000", "layer_001", "layer_002"]
  with pytest.raises(FileExistsError, match="not empty; pass --overwrite"):
    params_io.hf_to_orbax(tmp_path / "hf", tmp_path / "ours")
  cfg2, restored = params_io.load_params(tmp_path / "ours")
  assert cfg2 == got_cfg
  bf16 = lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa: E731
  np.testing.assert_array_equal(restored["layers"][0]["self_attn"]["q_proj"]["kernel"],
                                bf16(params["layers"][0]["self_attn"]["q_proj"]["kernel"]))
  params_io.orbax_to_hf(tmp_path / "ours", tmp_path / "hf2")
  a, b = hf_convert.HFCheckpoint(tmp_path / "hf"), hf_convert.HFCheckpoint(tmp_path / "hf2")
  assert a.keys == b.keys
  for key in sorted(a.keys)[:50]:
    np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.slow
def test_converted_checkpoint_carries_source_hashes_and_verifies_its_arrays(tmp_path):
  cfg = mc.tiny(dtype="float32", num_hidden_layers=2)
  hf_convert.params_to_hf(cfg, dm.init(cfg, jax.random.key(4)), tmp_path / "hf",
                          dtype=ml_dtypes.bfloat16, shard_tensors=8)
  params_io.hf_to_orbax(tmp_path / "hf", tmp_path / "ours")
  meta = json.loads((tmp_path / "ours" / "meta.json").read_text())
  sources = sorted([tmp_path / "hf" / "config.json", *(tmp_path / "hf").glob("*.safetensors")])
  assert len(sources) > 3
  assert sorted(meta["source"]["files"], key=lambda f: f["name"]) == [
      {"name": f.name, "bytes": f.stat().st_size,
       "sha256": hashlib.sha256(f.read_bytes()).hexdigest()} for f in sources]
  assert meta["digests"]["algorithm"] == checkpoint_digest.ALGORITHM
  assert "layers/1/mlp/experts_up" in meta["digests"]["arrays"]
  params_io.load_params(tmp_path / "ours")  # verified
  layer = tmp_path / "ours" / "params" / "layer_001"
  helpers.flip_a_decodable_bit(layer, lambda: ocp.PyTreeCheckpointer().restore(layer))
  with pytest.raises(checkpoint_digest.CorruptCheckpointError,
                     match=r"ours/params is corrupt: array layers/1/\S+ has digest"):
    params_io.orbax_to_hf(tmp_path / "ours", tmp_path / "hf2")
  (tmp_path / "ours" / "meta.json").unlink()  # a conversion made before meta.json existed
  with pytest.warns(checkpoint_digest.UnverifiedCheckpointWarning, match="no digests"):
    params_io.load_params(tmp_path / "ours")
