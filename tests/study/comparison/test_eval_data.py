"""The evaluation data of a sweep (fp8jax.study.comparison.eval_data)."""

import io

import numpy as np
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


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_reading_to_an_offset_shows_its_progress_and_lands_on_the_same_batch():
  """An offset is read through with a progress line (here a terminal's, redrawn at most
  every 0.5 s), and offset 2 is the third batch of the stream read from offset 0."""
  cfg = run_config.defaults()
  cfg.data.seq_len = 16
  tty = _Terminal()
  got = eval_data.eval_batches(cfg, eval_data.Windows(offsets=(2,), batches=1, batch_size=2),
                               stream=tty)
  assert "[compare: reading to data offset 2]" in tty.getvalue()
  assert "batches" in tty.getvalue() and "ETA" in tty.getvalue()
  plain = eval_data.eval_batches(cfg, eval_data.Windows(offsets=(0,), batches=3,
                                                        batch_size=2))
  np.testing.assert_array_equal(got[(2, 0)], plain[(0, 2)])
