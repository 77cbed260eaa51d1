"""The evaluation data of a sweep (fp8jax.study.comparison.eval_data)."""

import pytest

from fp8jax.study.comparison import eval_data, sweep
from fp8jax.train import run_config


def test_a_sequence_beyond_the_models_positions_is_refused_before_reading():
  cfg = run_config.defaults()  # the tiny model: 128 positions
  with pytest.raises(ValueError, match="seq_len .--seq_len. 256 exceeds the model's "
                                       "max_position_embeddings 128"):
    eval_data.eval_batches(cfg, eval_data.Windows(seq_len=256))
  assert sweep.Windows is eval_data.Windows  # the sweep's API keeps its names


def test_windows_name_the_bad_field():
  with pytest.raises(ValueError, match=r"batch_size \(--batch_size\) must be >= 1"):
    eval_data.Windows(batch_size=0)
