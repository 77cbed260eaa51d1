"""Dynamic loss scaling's bookkeeping (fp8jax/train/loss_scale.py): back-off, growth and the
minimum, step by step."""

import jax.numpy as jnp
import pytest

from fp8jax.train import loss_scale


def test_loss_scale_backs_off_grows_and_reports_the_minimum():
  ls = loss_scale.DynamicLossScale(init=8.0, growth_interval=3, minimum=2.0)
  state = ls.init_state()
  seen = []
  for finite in (True, True, True, False, True, False, False):
    state, absorbed = ls.update(state, jnp.bool_(finite))
    seen.append((float(state["scale"]), int(state["good_steps"]), int(state["skipped"]),
                 bool(absorbed)))
  assert seen == [(8, 1, 0, True), (8, 2, 0, True), (16, 0, 0, True), (8, 0, 1, True),
                  (8, 1, 1, True), (4, 0, 2, True), (2, 0, 3, True)]
  state, absorbed = ls.update(state, jnp.bool_(False))  # 2 / 2 < minimum 2
  assert not bool(absorbed) and float(state["scale"]) == 2.0
  with pytest.raises(ValueError, match="minimum"):
    loss_scale.DynamicLossScale(init=1.0, minimum=2.0)
