"""Verifying a run's checkpoints (fp8jax/train/verify.py): which statuses a reader may use, and
a folder that is no training run."""

import pytest

from fp8jax.train import checkpoint_digest as cd
from fp8jax.train import verify


@pytest.mark.parametrize("status, usable", [
    (cd.Ok("c/2", arrays=5), True), (cd.Ok("c/2", arrays=5, params_only=True), True),
    (cd.NoDigests("c/2"), True),
    (cd.Corrupt("c/2", "params/w", "0123", "4567"), False),
    (cd.Incomplete("c/2", "no metadata"), False), (cd.NonFinite("c/2", "params/w", 1), False),
    (cd.Foreign("c/2", "run-a", "run-b"), False)])
def test_is_usable_only_for_ok_and_undigested_checkpoints(status, usable):
  assert verify.is_usable(status) is usable


def test_verify_run_of_a_folder_without_a_run_names_its_config(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json not found"):
    verify.verify_run(tmp_path)
