"""Every config in experiments/configs/ loads and passes the run config's validation (an
unknown key, model, policy or a schedule that does not fit fails here, not on a GPU)."""

import importlib.util
import pathlib

import pytest

from fp8jax.models import layer_scan
from fp8jax.train import run_config

CONFIGS = sorted((pathlib.Path(__file__).parents[2] / "experiments" / "configs").glob("*.py"))


def _module(path):
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _load(path):
  return _module(path).get_config()


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name != "__init__.py"],
                         ids=lambda p: p.stem)
def test_config_validates(path):
  module = _module(path)
  cfg = module.get_config()
  model, policy = run_config.check(cfg)
  assert model.vocab_size >= 1 and model.abstract_params()
  model.check(policy)
  assert "python -m fp8jax.experiments." in (module.__doc__ or ""), "each config names its command"


def test_site_study_small_keeps_the_original_studys_layout():
  """9 layers, every one MoE (DeepSeek-MoE-2B's layout: the site grid's layer-0 MoE site
  exists), 11 checkpoints from step 0."""
  cfg = _load(CONFIGS[0].parent / "site_study_small.py")
  model_cfg = run_config.check(cfg)[0].config  # DeepSeek-MoE's ModelConfig
  assert model_cfg.num_hidden_layers == 9
  assert all(model_cfg.is_moe_layer(i) for i in range(9))
  assert cfg.train.checkpoints and cfg.train.steps // cfg.train.save_every + 1 == 11


def _train_config(**train):
  cfg = run_config.defaults()
  cfg.model = "tiny"
  cfg.optim.warmup_steps = 10
  for key, value in train.items():
    cfg.train[key] = value
  return cfg


def test_scan_options_come_from_the_run_config():
  assert run_config.scan_options(_train_config()) is None
  assert run_config.scan_options(_train_config(scan_layers=True)) == layer_scan.ScanOptions()
  cfg = _train_config(scan_layers=True, scan_unroll=1, scan_remat="nothing_saveable")
  assert run_config.scan_options(cfg) == layer_scan.ScanOptions(1, "nothing_saveable")
  # The 16B config rolls its scan and recomputes each layer (its FSDP step fits so).
  big = _load(CONFIGS[0].parent / "train_16b_c4.py")
  assert run_config.scan_options(big) == layer_scan.ScanOptions(1, "nothing_saveable")


@pytest.mark.parametrize("train, match", [
    ({"scan_remat": "nothing_saveable"}, "need train.scan_layers=True"),
    ({"scan_unroll": 2}, "need train.scan_layers=True"),
    ({"scan_layers": True, "scan_remat": "dots"}, "no policy of jax.checkpoint_policies"),
    ({"scan_layers": True, "scan_unroll": -1}, "layers per iteration")])
def test_scan_options_refused_by_name(train, match):
  with pytest.raises(ValueError, match=match):
    run_config.check(_train_config(**train))


@pytest.mark.parametrize("train, match", [
    ({"fsdp_gather_dtype": "bfloat16"}, "with train.fsdp=True"),
    ({"fsdp": True, "fsdp_gather_dtype": "float16"}, "must be '' or one of")])
def test_fsdp_gather_dtype_refused_by_name(train, match):
  with pytest.raises(ValueError, match=match):
    run_config.check(_train_config(**train))
  ok = _train_config(fsdp=True, fsdp_gather_dtype="bfloat16")
  run_config.check(ok)
