"""Delayed scaling at model sites: per-site amax histories through the model, the train step,
checkpoints and the paired evaluator, against a NumPy loop written from the definition."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.models import config as mc
from fp8jax.models import deepseek_model, delayed_sites
from fp8jax.models import deepseek_moe as dm
from fp8jax.models import policy as pl
from fp8jax.study.comparison import policies as policies_lib
from fp8jax.train import checkpoint, optim
from fp8jax.train import step as step_lib
from tests.references import reference as ref

TENSOR = fp8jax.per_tensor()
# attn_out@0: E4M3 forward (history 3, max) and E5M2 cotangent (history 2, most recent);
# moe_out@1-2: E4M3 forward (history 2, most recent, margin 1), straight-through.
ATTN = fp8jax.QuantSpec(granularity=TENSOR, scaling="delayed", history_len=3,
                        backward=fp8jax.QuantSpec(format="e5m2", granularity=TENSOR,
                                                  scaling="delayed", history_len=2,
                                                  history_reduce="most_recent"))
MIXED = pl.PrecisionPolicy((pl.SiteRule("attn_out", (0,), ATTN), *pl.parse_policy(
    "moe@1-2:e4m3/delayed(h=2,reduce=most_recent,margin=1)").rules), name="mixed")
ORDER = [("attn_out", 0), ("moe_out", 1), ("moe_out", 2)]  # the order the forward meets them


def _setup(seed=0):
  cfg = mc.tiny(dtype="float32")
  params = dm.init(cfg, jax.random.key(seed))
  tokens = jax.random.randint(jax.random.key(seed + 1), (2, 16), 0, cfg.vocab_size)
  return cfg, params, tokens


def _tap(record):
  """An identity whose backward passes the cotangent to ``record`` (host callback)."""
  @jax.custom_vjp
  def tap(x):
    return x

  def backward(_, g):
    jax.debug.callback(record, g)
    return (g,)

  tap.defvjp(lambda x: (x, None), backward)
  return tap


def _tapped_fake_quant(monkeypatch, records):
  """Wraps the model's fake_quant: records, per site (in trace order), its input ``x`` and
  output ``y`` and, in the backward, the incoming cotangent ``g`` and the outgoing ``dx``."""
  real, traced = fp8jax.fake_quant, []

  def record(label, kind, value):
    records.setdefault((label, kind), []).append(np.asarray(value))

  def wrapped(x, spec, state=None, **kw):
    label = ORDER[len(traced) % len(ORDER)]
    traced.append(label)
    rec = lambda kind: functools.partial(record, label, kind)  # noqa: E731
    y = real(_tap(rec("dx"))(x), spec, state, **kw)
    jax.debug.callback(rec("x"), x)
    jax.debug.callback(rec("y"), y)
    return _tap(rec("g"))(y)

  monkeypatch.setattr(fp8jax, "fake_quant", wrapped)


def _np_amax(x):
  return np.float32(np.max(np.abs(x[np.isfinite(x)])))


def _np_quantize(x, spec, history):
  """The NumPy reference of one delayed-scaled quantization; returns (x_hat, amax used,
  new history). The history's max or most recent entry; an empty one: x's own amax."""
  chosen = max(history) if spec.history_reduce == "max" else history[0]
  chosen = chosen if chosen > 0 else _np_amax(x)
  _, _, x_hat = ref.ref_quantize(x, spec.format, "tensor", (), (), eps=spec.eps,
                                 margin=spec.margin, amax=chosen)
  return x_hat, chosen, [_np_amax(x)] + history[:-1]


@pytest.mark.slow
def test_site_histories_over_training_steps_match_a_numpy_loop(monkeypatch):
  """Four train steps under MIXED: every site's output, quantized cotangent and history
  after each step, bit for bit against the NumPy loop on the recorded site tensors."""
  cfg, params, tokens = _setup()
  records = {}
  _tapped_fake_quant(monkeypatch, records)
  tx = optim.optimizer(optim.OptimConfig(peak_lr=1e-2, warmup_steps=0, total_steps=10))
  step = jax.jit(step_lib.make_train_step(deepseek_model.model(cfg), tx, MIXED))
  state = step_lib.init_state(params, tx, delayed_sites.init(cfg, MIXED))
  assert delayed_sites.layout(state.delayed) == {
      "attn_out/0/fwd": [3], "attn_out/0/bwd": [2], "moe_out/1/fwd": [2],
      "moe_out/2/fwd": [2]}
  zeros = lambda n: [np.float32(0)] * n  # noqa: E731
  hist = {("attn_out", 0, "fwd"): zeros(3), ("attn_out", 0, "bwd"): zeros(2),
          ("moe_out", 1, "fwd"): zeros(2), ("moe_out", 2, "fwd"): zeros(2)}
  stale = 0  # quantizations whose amax came from the history, not the tensor itself
  for t in range(4):
    state, m = step(state, tokens)
    jax.effects_barrier()
    assert bool(m["finite"])
    assert {len(v) for v in records.values()} == {t + 1}  # one record per site and step
    for site, layer in ORDER:
      x, y, g, dx = (records[((site, layer), k)][t] for k in ("x", "y", "g", "dx"))
      spec = MIXED.spec_for(site, layer)
      y_ref, used, hist[(site, layer, "fwd")] = _np_quantize(x, spec, hist[(site, layer,
                                                                            "fwd")])
      assert ref.same_bits(y, y_ref), (t, site, layer)
      stale += used != _np_amax(x)
      if spec.backward is None:  # straight-through
        assert ref.same_bits(dx, g)
      else:
        dx_ref, used, hist[(site, layer, "bwd")] = _np_quantize(
            g, spec.backward, hist[(site, layer, "bwd")])
        assert ref.same_bits(dx, dx_ref), (t, site, layer)
        stale += used != _np_amax(g)
      for d, h in state.delayed[site][layer].items():
        np.testing.assert_array_equal(h, np.array(hist[(site, layer, d)], np.float32))
  assert stale >= 6  # the histories, not the tensors' own amaxes, set most scales


@pytest.mark.slow
def test_history_length_one_is_current_scaling_on_a_repeated_batch():
  """With history 1, delayed scaling quantizes a batch with the amax it recorded on the
  same batch: logits and gradients equal current scaling's bit for bit (the first pass
  too, which takes the tensor's own amax). On another batch they do not."""
  cfg, params, tokens = _setup(1)
  other = jax.random.randint(jax.random.key(9), tokens.shape, 0, cfg.vocab_size)
  expr = "attn@0-2:e4m3{d}+shared@1-2:e5m2{d}+expert_in@2:e4m3{d}"
  current = pl.parse_policy(expr.format(d=""))
  delayed = pl.parse_policy(expr.format(d="/delayed(h=1)"))

  @functools.partial(jax.jit, static_argnums=3)
  def grads(p, s, tok, pol):
    def loss(p, s):
      logits, aux = dm.apply(p, tok, cfg, pol, delayed_state=s)
      return dm.lm_loss(logits, tok) + aux["aux_loss"], logits
    return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(p, s)

  (loss_c, logits_c), (g_c, _) = grads(params, {}, tokens, current)
  state = delayed_sites.init(cfg, delayed)
  for _ in range(2):
    (loss_d, logits_d), (g_d, state) = grads(params, state, tokens, delayed)
    assert ref.same_bits(np.asarray(logits_d), np.asarray(logits_c))
    assert float(loss_d) == float(loss_c)
    for a, b in zip(jax.tree.leaves(g_d), jax.tree.leaves(g_c)):
      assert ref.same_bits(np.asarray(a), np.asarray(b))
  _, (g_other, _) = grads(params, state, other, delayed)  # quantized with tokens' amaxes
  _, (g_other_c, _) = grads(params, {}, other, current)
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(g_other),
                                                     jax.tree.leaves(g_other_c)))


def test_policy_expressions_grid_and_their_errors():
  spec = pl.parse_spec("e4m3/delayed(h=16,reduce=most_recent,margin=1)")
  assert (spec.scaling, spec.history_len, spec.history_reduce, spec.margin,
          spec.granularity.kind) == ("delayed", 16, "most_recent", 1, "tensor")
  for text in ("e4m3/delayed", "e4m3/tensor/delayed()", "e4m3/" + pl.DELAYED_SYNTAX):
    s = pl.parse_spec(text)
    assert (s.scaling, s.history_len, s.history_reduce, s.margin) == ("delayed", 1024, "max", 0)
  assert pl.parse_policy("moe_l1-2_e4m3_delayed").rules[0].spec == pl.parse_spec(
      "e4m3/delayed()")
  grid = policies_lib.GRIDS["delayed"](3)
  assert len(grid) == 8 and grid["attn_l0-2_e4m3"] == "attn@0-2:e4m3"
  assert grid["moe_l0_e4m3_delayed"] == "moe@0:e4m3/delayed(h=1024,reduce=max,margin=0)"
  for text, error in [
      ("e4m3/delayed(h=0)", "history_len must be a positive integer"),
      ("e4m3/delayed(h=x)", "h='x'.* is not an integer"),
      ("e4m3/delayed(size=4)", "unknown delayed\\(...\\) argument 'size'"),
      ("e4m3/delayed(h=2,h=3)", "malformed delayed\\(...\\) argument 'h=3'"),
      ("e4m3/delayed(reduce)", "malformed delayed\\(...\\) argument 'reduce'"),
      ("e4m3/delayed(h=2", "malformed 'delayed\\(h=2'"),
      ("e4m3/delayed(reduce=min)", "unknown history_reduce 'min'"),
      ("e4m3/delayed(margin=99)", "margin must be an integer in \\[-64, 64\\]"),
      ("e4m3/1x128/delayed()", "delayed scaling is per-tensor only"),
  ]:
    with pytest.raises(ValueError, match=error):
      pl.parse_policy(f"attn@0:{text}")


@pytest.mark.slow
def test_state_that_does_not_fit_the_policy_is_named():
  cfg, params, tokens = _setup()
  state = delayed_sites.init(cfg, MIXED)
  cases = [
      (MIXED, None, "lacks \\['attn_out/0/bwd', 'attn_out/0/fwd'"),
      (MIXED, {**state, "attn": state["attn_out"]}, "unknown quantization site 'attn'"),
      (MIXED, {**state, "moe_out": {1: state["moe_out"][1]}}, "lacks \\['moe_out/2/fwd'\\]"),
      (MIXED, {**state, "attn_out": {0: {**state["attn_out"][0], "fwd": jnp.zeros(5)}}},
       "history shapes \\['attn_out/0/fwd: \\[5\\] \\(policy: \\[3\\]\\)'\\]"),
      (pl.parse_policy("attn@0:e4m3"), state, "has histories the policy does not use"),
  ]
  for pol, st, error in cases:
    with pytest.raises(ValueError, match=error):
      dm.apply(params, tokens, cfg, pol, delayed_state=st)
  # Only the sites the model runs get a history: moe_out on MoE layers, mlp_out on dense.
  everywhere = pl.parse_policy("moe@all:e4m3/delayed(h=2)+mlp@all:e5m2/delayed(h=2)")
  assert sorted(delayed_sites.sites(cfg, everywhere)) == [
      ("mlp_out", 0), ("moe_out", 1), ("moe_out", 2)]
  assert delayed_sites.init(cfg, pl.parse_policy("attn@all:e4m3")) == {}


@pytest.mark.slow
def test_train_state_round_trips_through_a_checkpoint_and_a_mismatch_is_named(tmp_path):
  cfg, params, _ = _setup()
  tx = optim.optimizer(optim.OptimConfig(peak_lr=1e-3, warmup_steps=1, total_steps=10))
  histories = jax.tree.map(lambda h: jnp.linspace(3.0, 1.0, h.size) ** 2,  # as after steps
                           delayed_sites.init(cfg, MIXED))
  state = step_lib.init_state(params, tx, histories)
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt", save_every=1)
  ckpt.save(2, state, {"step": 2}, {}, force=True)
  ckpt.wait()
  restored, _, meta = ckpt.restore(2, checkpoint.abstract_like(state))
  assert meta["delayed_state"]["attn_out/0/fwd"] == [3]
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(a, b)
  assert isinstance(restored, step_lib.TrainState)
  assert float(restored.delayed["moe_out"][2]["fwd"][0]) == 9.0
  other = pl.parse_policy("attn@0:e4m3/delayed(h=3)")
  for delayed in (delayed_sites.init(cfg, other), {}):  # another layout, or none
    target = checkpoint.abstract_like(state._replace(delayed=delayed))
    with pytest.raises(checkpoint.DelayedStateMismatchError,
                       match="holds the delayed-scaling state .*'moe_out/1/fwd'.* but the "
                             "policy needs"):
      ckpt.restore(2, target)
  ckpt.close()


@pytest.mark.slow
def test_evaluator_warm_up_cycles_the_window_and_records_each_amax():
  """Three warm-up passes over a two-batch window: the history holds the site's amax on
  batches 0, 1, 0 (newest first), each read from current scaling's telemetry."""
  from fp8jax.study.comparison import paired  # pylint: disable=import-outside-toplevel
  from fp8jax.train import mesh as mesh_lib  # pylint: disable=import-outside-toplevel

  cfg, params, _ = _setup(2)
  window = [jax.random.randint(jax.random.key(k), (4, 16), 0, cfg.vocab_size) for k in (5, 6)]
  pol = pl.parse_policy("attn@0:e4m3/delayed(h=4)")
  ev = paired.PairedEvaluator(deepseek_model.model(cfg), [pol, pl.parse_policy("attn@0:e4m3")],
                              mesh_lib.data_mesh())
  state = ev.warm_state(pol.name, params, window, 3)
  site_amax = jax.jit(lambda b: dm.apply(params, b, cfg, pl.parse_policy("attn@0:e4m3"),
                                         telemetry=True)[1]["telemetry"]["layer_0/attn_out"].amax)
  amax = [np.float32(site_amax(b)) for b in window]
  np.testing.assert_array_equal(state["attn_out"][0]["fwd"], [amax[0], amax[1], amax[0], 0])
  assert ev.warm_state("attn@0:e4m3", params, window, 3) == {}
  with pytest.raises(ValueError, match="warm-up steps must be >= 0"):
    ev.warm_state(pol.name, params, window, -1)


@pytest.mark.slow
def test_sweep_evaluates_delayed_policies_after_warm_up(train_run, tmp_path):
  """On a one-batch window, history-1 delayed scaling after warm-up gives current
  scaling's rows exactly; Transformer Engine's recipe (te_hybrid: delayed E4M3 forward and
  E5M2 cotangent) gives finite rows of its own; meta.json records the warm-up, and a
  rerun with another warm-up is refused."""
  from fp8jax.study.common import results_io  # pylint: disable=import-outside-toplevel
  from fp8jax.study.comparison import sweep  # pylint: disable=import-outside-toplevel

  out = tmp_path / "cmp"
  windows = sweep.Windows(offsets=(0,), batches=1, batch_size=4)
  pols = ["attn@0:e4m3", "attn@0:e4m3/delayed(h=1)", "moe@1-2:te_hybrid"]
  sweep.run(train_run, out, policies=pols, windows=windows, steps=[4], delayed_warmup=2,
            floor=False)
  rows = {r["policy"]: r for r in results_io.read(out / "rows.jsonl")}
  drop = lambda r: json.dumps({k: v for k, v in r.items() if k != "policy"})  # noqa: E731
  assert drop(rows["attn@0:e4m3"]) == drop(rows["attn@0:e4m3/delayed(h=1)"])
  te = rows["moe@1-2:te_hybrid"]
  assert te["finite"] and 0 < te["rel_err"] < 1
  meta = json.loads((out / "meta.json").read_text())["policies"]
  assert meta["attn@0:e4m3/delayed(h=1)"]["delayed_warmup"] == 2
  assert meta["attn@0:e4m3/delayed(h=1)"]["expr"] == (
      "attn_out@0:e4m3/tensor/delayed(h=1,reduce=max,margin=0)")
  assert "delayed_warmup" not in meta["attn@0:e4m3"]
  with pytest.raises(ValueError, match="after 2 delayed-scaling warm-up steps, not 3"):
    sweep.run(train_run, out, policies=pols, windows=windows, steps=[4], delayed_warmup=3)


@pytest.mark.slow
def test_training_with_delayed_sites_resumes_exactly(tmp_path):
  """The histories are carried in the train state and checkpointed: a run stopped at step 3
  and resumed logs the losses of an uninterrupted run and ends with its histories."""
  from fp8jax.train import loop, run_config  # pylint: disable=import-outside-toplevel
  from fp8jax.train import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  from tests.train.test_loop import losses, small_config  # pylint: disable=import-outside-toplevel

  def config(steps):
    c = small_config(steps=steps)
    c.policy = "attn@0-2:e4m3/delayed(h=4)+moe@1-2:te_hybrid"
    return c

  loop.train(config(6), tmp_path / "full")
  loop.train(config(3), tmp_path / "part")
  loop.train(config(6), tmp_path / "part", resume=True)
  assert losses(tmp_path / "part") == losses(tmp_path / "full")
  c = config(6)
  tx = optim.optimizer(run_config.optim_config(c))
  _, abstract, sharding = loop.state_layout(c, run_config.model(c), tx,
                                            mesh_lib.data_mesh())
  final = []
  for run in ("full", "part"):
    ckpt = checkpoint.Checkpointer(tmp_path / run / "checkpoints", save_every=1)
    final.append(ckpt.restore(6, loop.restore_target(abstract, sharding))[0].delayed)
    ckpt.close()
  assert np.all(np.asarray(final[0]["attn_out"][2]["fwd"]) > 0)  # four steps recorded
  for a, b in zip(jax.tree.leaves(final[0]), jax.tree.leaves(final[1]), strict=True):
    np.testing.assert_array_equal(a, b)
