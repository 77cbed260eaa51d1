"""Layers stored stacked per run (``models/layer_stack.py``): the layouts round-trip, the
model gives the same loss and gradients from either layout (scanned or not), the train
step names a non-finite stacked parameter by its layer, and checkpoints of either layout
load into either (verified against their digests)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp8jax.models import config as config_lib
from fp8jax.models import deepseek_model, deepseek_moe, layer_stack
from fp8jax.models import policy as policy_lib
from fp8jax.train import checkpoint
from fp8jax.train import step as step_lib

CFG = config_lib.tiny(num_hidden_layers=4, dtype="float32")  # layer 0 dense, 1-3 MoE
MODEL = deepseek_model.model(CFG)


def _equal(a, b) -> bool:
  same = jax.tree.map(
      lambda x, y: x.shape == y.shape and bool(np.array_equal(x, y, equal_nan=True)), a, b)
  return jax.tree.structure(a) == jax.tree.structure(b) and all(jax.tree.leaves(same))


@pytest.mark.slow
def test_layouts_round_trip_on_every_node_of_a_train_state():
  params = deepseek_moe.init(CFG, jax.random.key(0))
  state = step_lib.init_state(params, optax.adamw(1e-3))
  for groups in ([[0], [1, 2, 3]], [[0], [1], [2, 3]]):
    stacked = layer_stack.stack(state, groups)
    assert layer_stack.layout(stacked) == groups
    # every params-like node (params, Adam's two moments) is stacked alike
    mu = stacked.opt_state[0].mu
    assert layer_stack.runs(mu) == groups and layer_stack.runs(stacked.params) == groups
    assert layer_stack.is_stacked(stacked) == any(len(g) > 1 for g in groups)
    assert _equal(layer_stack.unstack(stacked), layer_stack.unstack(state))
    assert _equal(layer_stack.stack(stacked, [[0], [1, 2, 3]]),
                  layer_stack.stack(state, [[0], [1, 2, 3]]))  # from either layout
  stacked = layer_stack.stack(params, [[0], [1, 2, 3]])
  leaf = stacked["layer_runs"][1]["mlp"]["experts_up"]
  assert leaf.shape == (3, *params["layers"][1]["mlp"]["experts_up"].shape)
  np.testing.assert_array_equal(leaf[2], params["layers"][3]["mlp"]["experts_up"])
  abstract = layer_stack.stack(deepseek_moe.abstract_params(CFG), [[0], [1, 2, 3]])
  assert jax.tree.map(lambda x: x.shape, abstract) == jax.tree.map(lambda x: x.shape, stacked)


def test_bad_runs_are_refused_by_name():
  params = deepseek_moe.abstract_params(CFG)
  with pytest.raises(ValueError, match="do not cover the layers"):
    layer_stack.stack(params, [[0], [1, 2]])
  with pytest.raises(ValueError, match="consecutive layers"):
    layer_stack.stack(params, [[0], [1, 3], [2]])
  with pytest.raises(ValueError, match=r"layers \[0, 1\] are not alike"):  # dense, MoE
    layer_stack.stack(params, [[0, 1], [2, 3]])
  short = {**params, "layers": {i: params["layers"][i] for i in range(3)}}
  tokens = jnp.zeros((1, 8), jnp.int32)
  with pytest.raises(ValueError, match=r"hold layers \[\[0\], \[1\], \[2\]\], the model has 4"):
    jax.eval_shape(lambda p: deepseek_moe.apply(p, tokens, CFG), short)


@pytest.mark.slow
@pytest.mark.parametrize("expr", ["bf16", "attn@1-2:e4m3"])
def test_either_layout_gives_the_same_loss_and_gradients(expr):
  """Stored runs that match the policy's runs ([1, 2, 3] for BF16) are scanned as stored;
  others ([1, 2] and [3] under ``attn@1-2``) are sliced and joined: the same bits."""
  policy = policy_lib.parse_policy(expr)
  params = deepseek_moe.init(CFG, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, CFG.vocab_size)

  @jax.jit
  def grad(p):
    def loss(p):
      logits, aux = deepseek_moe.apply(p, tokens, CFG, policy, scan_layers=True)
      return deepseek_moe.lm_loss(logits, tokens) + aux["aux_loss"]
    return jax.value_and_grad(loss)(p)

  want_loss, want = grad(params)
  assert deepseek_moe.layer_runs(CFG, policy) == (
      [[0], [1, 2, 3]] if expr == "bf16" else [[0], [1, 2], [3]])
  groups = [[0], [1, 2, 3]] if expr == "bf16" else [[0], [1], [2, 3]]
  loss, got = grad(layer_stack.stack(params, groups))
  assert layer_stack.runs(got) == groups  # the gradient keeps the params' layout
  assert float(loss) == float(want_loss)
  assert _equal(layer_stack.unstack(got), want)


@pytest.mark.slow
def test_global_norm_sums_as_the_per_layer_layout_to_the_bit():
  """One reduction per stacked leaf, summed leaf by leaf in the per-layer order: the bits
  of optax's norm of the per-layer tree, where NumPy's order of the same sum differs."""
  rng = np.random.default_rng(1)
  other_order = 0
  for _ in range(8):
    tree = {"norm": rng.standard_normal(7).astype(np.float32),
            "layers": {i: {"w": (rng.standard_normal((129, 517)) * 10.0 ** rng.uniform(-3, 3)
                                 ).astype(np.float32)} for i in range(4)}}
    want = np.float32(optax.tree.norm(tree))
    for runs in ([[0], [1, 2, 3]], [[0, 1, 2, 3]]):
      got = np.float32(jax.jit(layer_stack.global_norm)(layer_stack.stack(tree, runs)))
      assert got.tobytes() == want.tobytes()
    squares = [np.sum(np.square(x), dtype=np.float32) for x in jax.tree.leaves(tree)]
    other_order += np.sqrt(np.sum(squares[::-1], dtype=np.float32)) != want
  assert other_order > 0  # the sum's order shows in its bits on these inputs


# A train step compiled (4 s alone, 13 s on two busy cores): the fast tier names stacked
# flags per layer in tests/train/test_step.py.
@pytest.mark.slow
def test_a_nonfinite_stacked_parameter_is_named_by_its_layer():
  tx = optax.sgd(1e-3)
  init = step_lib.seeded_init(MODEL, tx, policy_lib.BF16, stacked=True)
  state = init(0)
  assert layer_stack.layout(state.params) == [[0], [1, 2, 3]]
  bad = state.params["layer_runs"][1]["self_attn"]["q_proj"]["kernel"].at[1, 0, 0].set(jnp.nan)
  state = state._replace(params={**state.params, "layer_runs": {1: {
      **state.params["layer_runs"][1], "self_attn": {
          **state.params["layer_runs"][1]["self_attn"], "q_proj": {"kernel": bad}}}}})
  step = jax.jit(step_lib.make_train_step(MODEL, tx))
  new, m = step(state, jnp.zeros((2, 8), jnp.int32))
  assert not bool(m["finite"])
  assert step_lib.first_nonfinite(m["finite_groups"]) == "params/layers/2/self_attn/q_proj/kernel"
  assert _equal(new.params, state.params)


@pytest.mark.slow
def test_checkpoints_of_either_layout_load_into_either(tmp_path):
  tx = optax.adamw(1e-3)
  per_layer = step_lib.seeded_init(MODEL, tx, policy_lib.BF16)(0)
  stacked = layer_stack.stack(per_layer, [[0], [1, 2, 3]])
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt", save_every=1)
  ckpt.save(0, per_layer, {"step": 0}, {})  # a checkpoint of the per-layer layout
  ckpt.save(1, stacked, {"step": 1}, {})
  ckpt.wait()
  assert checkpoint.LAYER_RUNS not in checkpoint.saved_meta(ckpt, 0)
  assert checkpoint.saved_meta(ckpt, 1)[checkpoint.LAYER_RUNS] == [[0], [1, 2, 3]]
  for step in (0, 1):
    for want in (per_layer, stacked, layer_stack.stack(per_layer, [[0], [1], [2, 3]])):
      got, _, _ = ckpt.restore(step, checkpoint.abstract_like(want))
      assert _equal(got, want), (step, layer_stack.layout(want))
  ckpt.close()
  reader = checkpoint.Checkpointer(tmp_path / "ckpt", save_every=1)  # as compare reads
  params, _ = reader.restore_params(1, deepseek_moe.abstract_params(CFG))
  assert _equal(params, per_layer.params)
  reader.close()


@pytest.mark.slow
def test_the_paired_evaluator_gives_the_same_rows_from_stored_runs():
  """``compare --scan_layers`` stores each checkpoint's params stacked once
  (``PairedEvaluator.store``); its rows, gradients per layer, are those of the per-layer
  params, to float32 rounding: the two programs differ (one stacks the params in the step)
  and XLA may keep other BF16 intermediates in float32 in each, so the last bits can
  differ unless ``--xla_allow_excess_precision=false`` (bit for bit then:
  tests/models/test_layer_scan.py, tests/models/test_scan_wiring.py)."""
  from fp8jax.study.comparison import paired  # pylint: disable=import-outside-toplevel
  from fp8jax.train import mesh as mesh_lib  # pylint: disable=import-outside-toplevel

  policy = policy_lib.parse_policy("moe_l1-3_e4m3")  # runs [[0], [1, 2, 3]], as stored
  scanned = deepseek_model.model(CFG, deepseek_model.Options(scan=True))
  ev = paired.PairedEvaluator(scanned, [policy], mesh_lib.data_mesh(jax.devices()[:1]),
                              telemetry=False)
  params = deepseek_moe.init(CFG, jax.random.key(0))
  stored = ev.store(params)
  assert layer_stack.layout(stored) == [[0], [1, 2, 3]]
  assert layer_stack.layout(ev.store(deepseek_moe.abstract_params(CFG))) == [[0], [1, 2, 3]]
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, CFG.vocab_size)
  rows = []
  for p in (params, stored):
    base = ev.baseline(p, tokens)
    assert layer_stack.layout(base.grads) == [[0], [1], [2], [3]]
    rows.append(jax.device_get(ev.variant(policy.name, p, tokens, base)))
  flat = [dict(jax.tree_util.tree_leaves_with_path(
      r, is_leaf=lambda x: hasattr(x, "columns"))) for r in rows]
  assert flat[0].keys() == flat[1].keys() and len(flat[0]) > 10
  for key, value in flat[0].items():
    other = flat[1][key]
    if hasattr(value, "columns"):  # a metrics table: every column
      assert value.names == other.names, key
      value, other = ({c: np.asarray(v) for c, v in t.columns.items()} for t in (value, other))
    same = jax.tree.map(lambda x, y: x.shape == y.shape and np.allclose(
        x, y, rtol=1e-5, atol=1e-7, equal_nan=True), value, other)
    assert jax.tree.structure(value) == jax.tree.structure(other), key
    assert all(jax.tree.leaves(same)), (key, jax.tree.map(
        lambda x, y: float(np.max(np.abs(np.subtract(x, y), dtype=np.float64))), value, other))


@pytest.mark.slow
def test_perturbation_and_branch_metrics_read_the_per_layer_view():
  """The noise floor's perturbation draws as for per-layer params and keeps the layout;
  the branch metrics group stacked params by layer and module as per-layer ones."""
  from fp8jax.study.branches import branch_metrics  # pylint: disable=import-outside-toplevel
  from fp8jax.study.common import noise_floor  # pylint: disable=import-outside-toplevel

  params = deepseek_moe.init(CFG, jax.random.key(0))
  groups = [[0], [1, 2, 3]]
  key = jax.random.key(7)
  moved = noise_floor.perturb(layer_stack.stack(params, groups), key)
  assert layer_stack.layout(moved) == groups
  assert _equal(layer_stack.unstack(moved), noise_floor.perturb(params, key))
  per_layer = branch_metrics.compare_step(params, moved_pl := layer_stack.unstack(moved),
                                          moved_pl, params, {}, {})
  stacked = branch_metrics.compare_step(*(layer_stack.stack(t, groups) for t in (
      params, moved_pl, moved_pl, params)), {}, {})
  assert float(per_layer["param_div"]) == float(stacked["param_div"]) > 0
  for table in ("by_module", "by_layer"):
    assert per_layer[table].names == stacked[table].names
    assert _equal(per_layer[table].columns, stacked[table].columns)
