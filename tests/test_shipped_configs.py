"""Every config in experiments/configs/ loads and passes the run config's validation (an
unknown key, model, policy or a schedule that does not fit fails here, not on a GPU)."""

import importlib.util
import pathlib

import pytest

from fp8jax.train import run_config

CONFIGS = sorted((pathlib.Path(__file__).parents[1] / "experiments" / "configs").glob("*.py"))


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name != "__init__.py"],
                         ids=lambda p: p.stem)
def test_config_validates(path):
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config()
  model_cfg, _ = run_config.validate(cfg)
  assert model_cfg.num_hidden_layers >= 1
  assert "python -m fp8jax.experiments." in (module.__doc__ or ""), "each config names its command"


def test_seed_study_small_keeps_the_seed_studys_layout():
  """9 layers, every one MoE (DeepSeek-MoE-2B's layout: the seed grid's layer-0 MoE site
  exists), 11 checkpoints from step 0."""
  spec = importlib.util.spec_from_file_location(
      "seed_study_small", CONFIGS[0].parent / "seed_study_small.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config()
  model_cfg, _ = run_config.validate(cfg)
  assert model_cfg.num_hidden_layers == 9
  assert all(model_cfg.is_moe_layer(i) for i in range(9))
  assert cfg.train.checkpoints and cfg.train.steps // cfg.train.save_every + 1 == 11
