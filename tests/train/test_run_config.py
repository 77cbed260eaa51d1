"""The run config's own functions (``fp8jax.train.run_config``): saved configs filled in
with the keys added since, read with errors that name the file, and the optimizer's
config taken from the run's."""

import pytest

from fp8jax.train import run_config


def test_with_defaults_fills_only_missing_keys_at_every_depth():
  ref = {"a": 1, "g": {"x": 1, "y": 2, "h": {"z": 3}}, "new": {"k": 0}, "flat": {"u": 1}}
  saved = {"a": 5, "g": {"x": 9, "h": {}}, "flat": 7, "old": "kept"}
  assert run_config.with_defaults(saved, ref) == {
      "a": 5, "g": {"x": 9, "y": 2, "h": {"z": 3}}, "new": {"k": 0}, "flat": 7,
      "old": "kept"}
  assert saved == {"a": 5, "g": {"x": 9, "h": {}}, "flat": 7, "old": "kept"}  # not mutated


def test_read_saved_names_the_file_and_line(tmp_path):
  path = tmp_path / "config.json"
  path.write_text('{"model": "llama:tiny",\n "train": {"steps": 3}}')
  assert run_config.read_saved(path) == {"model": "llama:tiny", "train": {"steps": 3}}
  path.write_text('{"model": "llama:tiny",\n "train": }')
  with pytest.raises(ValueError, match=r"config\.json:2: not valid JSON"):
    run_config.read_saved(path)
  path.write_text("[1, 2]")
  with pytest.raises(ValueError, match=r"config\.json:1: not a run config \(a JSON list"):
    run_config.read_saved(path)
  path.write_bytes(b'{"a": "\xff"}')
  with pytest.raises(ValueError, match="not text"):
    run_config.read_saved(path)


def test_optim_config_takes_the_run_length_when_total_steps_is_zero():
  c = run_config.defaults()
  c.train.steps = 40
  c.optim.update(total_steps=0, warmup_steps=4, decay_at=[0.5, 0.75], peak_lr=0.02)
  o = run_config.optim_config(c)
  assert (o.total_steps, o.warmup_steps, o.decay_at, o.peak_lr) == (40, 4, (0.5, 0.75), 0.02)
  c.optim.total_steps = 60
  assert run_config.optim_config(c).total_steps == 60
