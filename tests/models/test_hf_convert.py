"""HF checkpoint conversion (``fp8jax.models.hf_convert``): validation, round trips, the
grouped-query layout (safetensors IO: ``tests/models/test_safetensors_io.py``; the Orbax
side and source hashes: ``tests/train/test_params_io.py``)."""

import json

import jax
import ml_dtypes
import numpy as np
import pytest

from fp8jax.models import config as mc
from fp8jax.models import deepseek_moe as dm
from fp8jax.models import hf_convert
from fp8jax.models import safetensors_io as st


@pytest.mark.slow
@pytest.mark.parametrize("pad", [None, 40])
def test_params_hf_round_trip(tmp_path, pad):
  cfg = mc.tiny(dtype="float32")
  params = dm.init(cfg, jax.random.key(0))
  hf_convert.params_to_hf(cfg, params, tmp_path, shard_tensors=20)
  assert len(list(tmp_path.glob("*.safetensors"))) > 3
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  assert set(index["weight_map"]) == set(hf_convert.hf_tensor_shapes(cfg))
  loaded_cfg = hf_convert.config_from_hf(json.loads((tmp_path / "config.json").read_text()),
                                         dtype="float32", expert_pad_to=pad)
  back = hf_convert.hf_to_params(loaded_cfg, tmp_path)
  if pad is None:
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
      np.testing.assert_array_equal(a, b)
  tokens = jax.random.randint(jax.random.key(1), (2, 10), 0, cfg.vocab_size)
  np.testing.assert_allclose(dm.apply(back, tokens, loaded_cfg)[0],
                             dm.apply(params, tokens, cfg)[0], rtol=1e-5, atol=1e-5)


def test_mismatched_checkpoints_name_their_keys(tmp_path):
  cfg = mc.tiny(dtype="float32")
  # zeros of the params' shapes: the keys and shapes are what this test reads (a random
  # init compiles a sampler per parameter shape: seconds)
  params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype),
                        jax.eval_shape(lambda: dm.init(cfg, jax.random.key(0))))
  hf_convert.params_to_hf(cfg, params, tmp_path)
  with pytest.raises(ValueError, match=r"missing: \['model.layers.3"):
    hf_convert.hf_to_params(cfg.replace(num_hidden_layers=4), tmp_path)
  with pytest.raises(ValueError, match=r"unexpected: \['model.layers.2"):
    hf_convert.hf_to_params(cfg.replace(num_hidden_layers=2), tmp_path)
  with pytest.raises(ValueError, match="wrong shapes"):
    hf_convert.hf_to_params(cfg.replace(vocab_size=300), tmp_path)
  with pytest.raises(ValueError, match="not a DeepSeek-MoE v1 config"):
    hf_convert.config_from_hf({"model_type": "llama"})
  no_shared = {**hf_convert.config_to_hf(cfg), "n_shared_experts": None}
  assert hf_convert.config_from_hf(no_shared).n_shared_experts == 0


def _hf_dir(path, hf_config, tensors=None):
  """An HF checkpoint folder: config.json and one safetensors file (``tensors``: name ->
  array), or a corrupt safetensors file when ``tensors`` is None."""
  path.mkdir()
  (path / "config.json").write_text(json.dumps(hf_config))
  if tensors is None:
    (path / "model.safetensors").write_bytes(b"\xff" * 64)
  else:
    st.write(path / "model.safetensors", [(k, v.shape, v.dtype) for k, v in tensors.items()],
             tensors.__getitem__)
  return path


@pytest.mark.slow
def test_grouped_query_attention_hf_round_trip(tmp_path):
  """HF layout (k/v projections [kv_heads * head_dim, d]) -> fp8jax Orbax -> HF layout,
  bit for bit, with the config's num_key_value_heads carried both ways."""
  from fp8jax.train import params_io

  cfg = mc.tiny(num_key_value_heads=2, num_hidden_layers=2)
  hf_config = {**hf_convert.config_to_hf(cfg), "_name_or_path": "gqa", "pretraining_tp": 1,
               "torch_dtype": "bfloat16", "auto_map": {"AutoConfig": "x.DeepseekConfig"}}
  assert hf_config["num_key_value_heads"] == 2
  rng = np.random.default_rng(0)
  tensors = {k: rng.standard_normal(s).astype(ml_dtypes.bfloat16)
             for k, s in hf_convert.hf_tensor_shapes(cfg).items()}
  for proj, rows in (("q", 64), ("k", 32), ("v", 32), ("o", 64)):  # 4 heads, 2 kv, 16 each
    assert tensors[f"model.layers.1.self_attn.{proj}_proj.weight"].shape == (rows, 64)
  _hf_dir(tmp_path / "hf", hf_config, tensors)
  got = params_io.hf_to_orbax(tmp_path / "hf", tmp_path / "ours")
  assert got == cfg and got.kv_heads == 2
  cfg2, params = params_io.load_params(tmp_path / "ours")
  assert cfg2 == cfg
  k0 = params["layers"][0]["self_attn"]["k_proj"]["kernel"]
  np.testing.assert_array_equal(k0, np.asarray(
      tensors["model.layers.0.self_attn.k_proj.weight"], np.float32).T)
  params_io.orbax_to_hf(tmp_path / "ours", tmp_path / "hf2")
  back = hf_convert.HFCheckpoint(tmp_path / "hf2")
  assert back.keys == set(tensors)
  for key, want in tensors.items():
    np.testing.assert_array_equal(back[key], want, err_msg=key)
  exported = json.loads((tmp_path / "hf2" / "config.json").read_text())
  assert exported["num_key_value_heads"] == 2 and exported["num_attention_heads"] == 4


@pytest.mark.parametrize("field,value", [
    ("rope_scaling", {"type": "linear", "factor": 2.0}), ("attention_bias", True),
    ("attention_dropout", 0.1), ("hidden_act", "gelu"), ("scoring_func", "sigmoid"),
    ("tie_word_embeddings", True), ("head_dim", 32), ("num_key_value_heads", 3),
    ("n_routed_experts", None)])
def test_unsupported_hf_fields_are_refused_by_name_before_tensors(tmp_path, field, value):
  from fp8jax.train import params_io

  hf = _hf_dir(tmp_path / "hf", {**hf_convert.config_to_hf(mc.tiny()), field: value})
  with pytest.raises(ValueError, match=field) as e:  # not the corrupt safetensors file
    params_io.hf_to_orbax(hf, tmp_path / "ours")
  assert not isinstance(e.value, st.SafetensorsError)
  assert not (tmp_path / "ours").exists()
  with pytest.raises(st.SafetensorsError):  # the file is indeed unreadable
    hf_convert.HFCheckpoint(hf)


def test_harmless_hf_fields_are_accepted_and_all_unsupported_ones_named():
  base = hf_convert.config_to_hf(mc.tiny())
  harmless = {**base, "_name_or_path": "deepseek-ai/deepseek-moe-16b-base",
              "torch_dtype": "bfloat16", "transformers_version": "4.36.0", "use_cache": True,
              "bos_token_id": 100000, "eos_token_id": 100001, "pretraining_tp": 1,
              "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
              "num_key_value_heads": None, "head_dim": 16, "hidden_act": "silu"}
  assert hf_convert.config_from_hf(harmless) == mc.tiny()
  without = {k: v for k, v in base.items() if k not in ("num_key_value_heads", "hidden_act")}
  assert hf_convert.config_from_hf(without) == mc.tiny()
  with pytest.raises(ValueError, match=r"rope_scaling=\{'type': 'dynamic'.*; attention_bias"
                                       r"=True \(supported: False\)"):
    hf_convert.config_from_hf({**base, "rope_scaling": {"type": "dynamic", "factor": 4.0},
                               "attention_bias": True})
