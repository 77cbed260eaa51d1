"""Optimizer schedule and the train step (single device)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp8jax.models import config as mc
from fp8jax.models import deepseek_model, layer_stack
from fp8jax.models import deepseek_moe as dm
from fp8jax.train import optim
from fp8jax.train import step as step_lib


def test_schedule_matches_the_paper_recipe():
  cfg = optim.OptimConfig(peak_lr=1.0, warmup_steps=100, total_steps=1000)
  lr = optim.schedule(cfg)
  assert float(lr(0)) == 0.0 and float(lr(50)) == pytest.approx(0.5)
  assert float(lr(100)) == pytest.approx(1.0) and float(lr(799)) == pytest.approx(1.0)
  assert float(lr(800)) == pytest.approx(0.316) and float(lr(899)) == pytest.approx(0.316)
  assert float(lr(900)) == pytest.approx(0.316**2) and float(lr(999)) == pytest.approx(0.316**2)
  with pytest.raises(ValueError, match="warmup_steps 2000 must be in"):
    optim.OptimConfig(warmup_steps=2000, total_steps=100)


def _setup():
  """(DeepSeek-MoE tiny in float32, its params, an optimizer, a batch of tokens)."""
  cfg = mc.tiny(dtype="float32")
  params = dm.init(cfg, jax.random.key(0))
  tx = optim.optimizer(optim.OptimConfig(peak_lr=3e-3, warmup_steps=2, total_steps=50))
  tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, cfg.vocab_size)
  return deepseek_model.model(cfg), params, tx, tokens


@pytest.mark.slow
def test_train_step_reduces_the_loss_on_a_fixed_batch():
  model, params, tx, tokens = _setup()
  step = jax.jit(step_lib.make_train_step(model, tx))
  state = step_lib.init_state(params, tx)
  losses = []
  for _ in range(15):
    state, m = step(state, tokens)
    losses.append(float(m["lm_loss"]))
    assert bool(m["finite"]) and float(m["aux_loss"]) > 0
  assert losses[-1] < losses[0] - 0.5 and int(state.step) == 15


@pytest.mark.slow
def test_nonfinite_gradients_are_named_and_skip_the_update():
  model, params, tx, tokens = _setup()
  bad = jax.tree.map(lambda x: x, params)
  bad["layers"][1]["mlp"]["experts_up"] = bad["layers"][1]["mlp"]["experts_up"].at[
      0, 0, 0].set(jnp.nan)
  step = jax.jit(step_lib.make_train_step(model, tx))
  state = step_lib.init_state(bad, tx)
  new, m = step(state, tokens)
  assert not bool(m["finite"]) and int(new.step) == 0
  assert step_lib.first_nonfinite(m["finite_groups"]) == "params/layers/1/mlp/experts_up"
  huge = jax.tree.map(lambda x: x, params)
  huge["lm_head"]["kernel"] = huge["lm_head"]["kernel"] * 1e38  # overflowing logits
  _, m2 = step(step_lib.init_state(huge, tx), tokens)
  assert not bool(m2["finite"])
  assert step_lib.first_nonfinite(m2["finite_groups"]).startswith("grads/")
  np.testing.assert_array_equal(new.params["norm"]["weight"], bad["norm"]["weight"])
  # A NaN in the optimizer state (finite params and gradients): with check_update the
  # update is not applied; by default it is, and the state it leaves names the parameter.
  state = step_lib.init_state(params, tx)
  nan_mu = jax.tree.map(lambda x: x, state.opt_state)
  adam = next(s for s in jax.tree.leaves(nan_mu, is_leaf=lambda x: hasattr(x, "mu"))
              if hasattr(s, "mu"))
  adam.mu["norm"]["weight"] = adam.mu["norm"]["weight"].at[0].set(jnp.nan)
  checked = jax.jit(step_lib.make_train_step(model, tx, check_update=True))
  new, m3 = checked(state._replace(opt_state=nan_mu), tokens)
  assert not bool(m3["finite"]) and int(new.step) == 0
  assert step_lib.first_nonfinite(m3["finite_groups"]) == "new_params/norm/weight"
  assert np.all(np.isfinite(new.params["norm"]["weight"]))
  new, m4 = step(state._replace(opt_state=nan_mu), tokens)
  assert bool(m4["finite"]) and int(new.step) == 1
  assert step_lib.first_nonfinite(step_lib.state_finite(new)) == "new_params/norm/weight"


@pytest.mark.slow
@pytest.mark.parametrize("check_update", [True, False])
def test_an_update_that_overflows_the_weights(check_update):
  """Finite gradients, a learning rate that sends the weights to inf: with check_update
  the step is flagged at the updated parameters and leaves the state as it was; without,
  it is applied, the state it leaves is named non-finite, and the next step refuses to
  read it."""
  model, params, _, tokens = _setup()
  sgd = optax.chain(optax.scale(1e30), optax.scale(1e30))  # 1e60 x the gradient
  step = jax.jit(step_lib.make_train_step(model, sgd, check_update=check_update))
  new, m = step(step_lib.init_state(params, sgd), tokens)
  if check_update:
    assert not bool(m["finite"]) and int(new.step) == 0
    assert step_lib.first_nonfinite(m["finite_groups"]).startswith("new_params/")
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(params)):
      np.testing.assert_array_equal(a, b)
    return
  assert bool(m["finite"]) and int(new.step) == 1
  assert step_lib.first_nonfinite(step_lib.state_finite(new)).startswith("new_params/")
  after, m2 = step(new, tokens)
  assert not bool(m2["finite"]) and int(after.step) == 1
  assert step_lib.first_nonfinite(m2["finite_groups"]).startswith("params/")


@pytest.mark.parametrize("stacked", [False, True])
def test_all_finite_names_each_layer_of_a_stacked_run(stacked):
  """One reduction per stacked leaf, its flags split per layer: the same names and
  values as the per-layer layout."""
  runs = [[0], [1, 2, 3]]
  tree = {"embed": np.ones((3, 2), np.float32),
          "layers": {i: {"w": np.ones((2, 2), np.float32)} for i in range(4)}}
  tree["layers"][2]["w"][1, 0] = np.inf
  tree["layers"][3]["w"][0, 1] = np.nan
  if stacked:
    tree = layer_stack.stack(tree, runs)
  flags = jax.device_get(step_lib.all_finite(tree))
  assert {i: bool(v["w"]) for i, v in flags["layers"].items()} == {
      0: True, 1: True, 2: False, 3: False}
  assert bool(flags["embed"])
  assert step_lib.first_nonfinite({"params": flags}) == "params/layers/2/w"


@pytest.mark.parametrize("field,value", [("peak_lr", float("nan")), ("peak_lr", float("inf")),
                                         ("peak_lr", -1.0), ("clip_norm", -0.5),
                                         ("weight_decay", float("nan")), ("b2", 1.0)])
def test_optimizer_settings_outside_their_range_are_refused(field, value):
  with pytest.raises(ValueError, match=f"optim.{field} must be"):
    optim.OptimConfig(**{field: value})
