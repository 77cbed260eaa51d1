"""Training-precision options: BF16 moments and master weights, FP16 with dynamic loss
scaling, the simulated FP8 parameter gather. The policy recorded with the checkpoints, runs
without checkpoints and the step's routing output: ``tests/train/test_train_policy_record.py``."""

import io

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
import optax
import pytest

from fp8jax.models import config as mc
from fp8jax.models import deepseek_model
from fp8jax.models import deepseek_moe as dm
from fp8jax.train import checkpoint, loop, loss_scale, optim, run_config
from fp8jax.train import mesh as mesh_lib
from fp8jax.train import step as step_lib
from tests.train_cases import rows, small_config

BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("key, value, error", [
    ("moments", "float16", r"precision.moments must be one of"),
    ("master_weights", "fp32", r"precision.master_weights must be one of"),
    ("loss_scale", "static", r"precision.loss_scale must be one of"),
    ("loss_scale_growth_interval", 0, r"precision.loss_scale_growth_interval must be"),
    ("loss_scale_min", 0.0, r"precision.loss_scale_min must be"),
    ("loss_scale_init", 0.5, r"precision.loss_scale_init must be .* >= "),
    ("fp8_param_gather", "yes", r"precision.fp8_param_gather must be a bool"),
])
def test_bad_precision_options_fail_naming_the_key(tmp_path, key, value, error):
  c = small_config()
  c.precision = ml_collections.ConfigDict({**c.precision.to_dict(), key: value})
  with pytest.raises(ValueError, match=error):
    loop.train(c, tmp_path)
  assert not (tmp_path / "checkpoints").exists()


# --- optimizer state ---------------------------------------------------------------------


def test_state_dtypes_follow_the_precision_options():
  mesh = mesh_lib.data_mesh()
  model = deepseek_model.model(mc.tiny())
  for moments, master in (("float32", "float32"), ("bfloat16", "float32"),
                          ("float32", "bfloat16"), ("bfloat16", "bfloat16")):
    c = small_config(moments=moments, master_weights=master)
    tx = loop.optimizer_for(c)
    _, abstract, _ = loop.state_layout(c, model, tx, mesh)
    adam = abstract.opt_state[1][0]
    assert isinstance(adam, optax.ScaleByAdamState)
    assert {x.dtype for x in jax.tree.leaves(abstract.params)} == {jnp.dtype(master)}
    assert {x.dtype for x in jax.tree.leaves((adam.mu, adam.nu))} == {jnp.dtype(moments)}
    # Every option keeps the default's state structure (readers restore any of them).
    default = jax.eval_shape(optim.optimizer(run_config.optim_config(c)).init,
                             abstract.params)
    assert jax.tree.structure(default) == jax.tree.structure(abstract.opt_state)
    assert abstract.loss_scale == {}


def _adamw_reference(params, grads_seq, *, lr, b1, b2, eps, wd, clip, bf16_moments):
  """AdamW in float64 (clip by global norm, bias correction, decoupled decay on matrices);
  with ``bf16_moments`` the stored moments are rounded to BF16 after each update (the
  update itself uses the unrounded ones). Returns the params after each step."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  out = []
  for t, grads in enumerate(grads_seq, start=1):
    g = {k: np.asarray(x, np.float64) for k, x in grads.items()}
    norm = np.sqrt(sum(np.sum(x * x) for x in g.values()))
    g = {k: x * min(1.0, clip / norm) for k, x in g.items()}
    for k in p:
      m_new = b1 * m[k] + (1 - b1) * g[k]
      v_new = b2 * v[k] + (1 - b2) * g[k] ** 2
      u = (m_new / (1 - b1**t)) / (np.sqrt(v_new / (1 - b2**t)) + eps)
      if p[k].ndim >= 2:
        u = u + wd * p[k]
      p[k] = p[k] - lr * u
      if bf16_moments:
        m_new = m_new.astype(BF16).astype(np.float64)
        v_new = v_new.astype(BF16).astype(np.float64)
      m[k], v[k] = m_new, v_new
    out.append(({k: x.copy() for k, x in p.items()}, dict(m), dict(v)))
  return out


def test_bf16_moments_match_a_float64_adamw_reference():
  c = small_config(moments="bfloat16")
  c.optim.update(peak_lr=0.1, warmup_steps=0, total_steps=100, clip_norm=1.0)
  assert float(optim.schedule(run_config.optim_config(c))(2)) == pytest.approx(0.1)
  tx = loop.optimizer_for(c)
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(16, 24)).astype(np.float32),
            "b": rng.normal(size=(24,)).astype(np.float32)}
  grads_seq = [{k: (rng.normal(size=x.shape) * 0.3).astype(np.float32)
                for k, x in params.items()} for _ in range(3)]
  o = c.optim
  kw = dict(lr=0.1, b1=o.b1, b2=o.b2, eps=1e-8, wd=o.weight_decay, clip=o.clip_norm)
  want = _adamw_reference(params, grads_seq, bf16_moments=True, **kw)
  unrounded = _adamw_reference(params, grads_seq, bf16_moments=False, **kw)
  p, state = jax.tree.map(jnp.asarray, params), tx.init(params)
  update = jax.jit(tx.update)
  for i, grads in enumerate(grads_seq):
    updates, state = update(jax.tree.map(jnp.asarray, grads), state, p)
    p = optax.apply_updates(p, updates)
    adam = state[1][0]
    assert adam.mu["w"].dtype == adam.nu["w"].dtype == jnp.bfloat16
    ref_p, ref_m, ref_v = want[i]
    for k in p:
      start = want[i - 1][0][k] if i else params[k].astype(np.float64)
      delta = np.asarray(p[k], np.float64) - start
      np.testing.assert_allclose(delta, ref_p[k] - start, rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(np.asarray(adam.mu[k], np.float64), ref_m[k], rtol=2**-8)
      np.testing.assert_allclose(np.asarray(adam.nu[k], np.float64), ref_v[k], rtol=2**-8)
  # The reference tells the rounding apart: without it, step 2 differs by far more than
  # the tolerance above (2.7e-4).
  assert np.abs(want[1][0]["w"] - unrounded[1][0]["w"]).max() > 1e-4


@pytest.mark.slow
def test_bf16_master_weights_round_the_float32_update_to_nearest():
  cfg = mc.tiny()
  tx = optim.optimizer(optim.OptimConfig(peak_lr=1e-2, warmup_steps=0, total_steps=10),
                       moments_dtype="float32")
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), dm.init(cfg, jax.random.key(0)))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
  step = jax.jit(step_lib.make_train_step(deepseek_model.model(cfg), tx))
  new, m = step(step_lib.init_state(params, tx), tokens)
  # The same step on float32 copies of the same values: p + update without rounding.
  params32 = jax.tree.map(lambda x: x.astype(jnp.float32), params)
  exact, m32 = step(step_lib.init_state(params32, tx), tokens)
  assert bool(m["finite"]) and float(m["loss"]) == float(m32["loss"])
  for got, full in zip(jax.tree.leaves(new.params), jax.tree.leaves(exact.params)):
    assert got.dtype == jnp.bfloat16
    want = np.asarray(full).astype(BF16)  # round to nearest even
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(new.params),
                                                      jax.tree.leaves(params)))


# --- dynamic loss scaling ----------------------------------------------------------------


@pytest.mark.slow
def test_scaled_step_equals_the_plain_step_and_skips_an_overflow():
  cfg = mc.tiny(dtype="float32")
  tx = optim.optimizer(optim.OptimConfig(peak_lr=3e-3, warmup_steps=1, total_steps=10))
  params = dm.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
  model = deepseek_model.model(cfg)
  plain, _ = jax.jit(step_lib.make_train_step(model, tx))(step_lib.init_state(params, tx),
                                                           tokens)
  ls = loss_scale.DynamicLossScale(init=2.0**10, growth_interval=5)
  scaled_step = jax.jit(step_lib.make_train_step(model, tx, loss_scale=ls))
  scaled, m = scaled_step(step_lib.init_state(params, tx, loss_scale=ls.init_state()), tokens)
  for a, b in zip(jax.tree.leaves(scaled.params), jax.tree.leaves(plain.params)):
    np.testing.assert_array_equal(a, b)  # a power-of-two scale is exact
  assert float(m["loss_scale"]) == 2.0**10 and int(m["skipped_steps"]) == 0
  assert int(scaled.loss_scale["good_steps"]) == 1
  # FP16 compute with a scale of 2**60: the scaled gradients overflow.
  cfg16 = mc.tiny(dtype="float16")
  ls = loss_scale.DynamicLossScale(init=2.0**60)
  state = step_lib.init_state(params, tx, loss_scale=ls.init_state())
  step16 = step_lib.make_train_step(deepseek_model.model(cfg16), tx, loss_scale=ls)
  new, m = jax.jit(step16)(state, tokens)
  assert not bool(m["finite"]) and bool(m["skipped"]) and np.isfinite(float(m["loss"]))
  assert float(m["loss_scale"]) == 2.0**59 and int(m["skipped_steps"]) == 1
  assert int(new.step) == 0
  for a, b in zip(jax.tree.leaves((new.params, new.opt_state)),
                  jax.tree.leaves((state.params, state.opt_state))):
    np.testing.assert_array_equal(a, b)


def _simulate_scale(init, interval, skipped_flags):
  """The scale after each step from the per-step skip flags (independent bookkeeping)."""
  scale, good, out = init, 0, []
  for skipped in skipped_flags:
    if skipped:
      scale, good = scale / 2, 0
    else:
      good += 1
      if good == interval:
        scale, good = scale * 2, 0
    out.append(scale)
  return out


@pytest.mark.slow
def test_fp16_run_skips_overflowing_steps_backs_off_recovers_and_resumes(tmp_path):
  def config(steps):
    c = small_config(steps, loss_scale="dynamic", loss_scale_init=2.0**24,
                     loss_scale_growth_interval=4)
    c.model_overrides.dtype = "float16"
    c.optim.total_steps = 24
    c.train.save_every = 12
    return c

  out = io.StringIO()
  summary = loop.train(config(24), tmp_path / "full", stream=out)
  got = rows(tmp_path / "full")
  assert [r["step"] for r in got] == list(range(1, 25))
  counts = [r["skipped_steps"] for r in got]
  flags = [b - a for a, b in zip([0, *counts], counts)]
  assert set(flags) <= {0, 1} and flags[0] == 1  # 2**24 overflows FP16 at once
  assert 0 < counts[-1] < 20 and flags[-8:].count(0) >= 4  # recovered: updates apply
  assert [r["loss_scale"] for r in got] == _simulate_scale(2.0**24, 4, flags)
  growths = [i for i in range(1, 24) if got[i]["loss_scale"] > got[i - 1]["loss_scale"]]
  assert growths, "no growth after 4 good steps"
  assert np.isfinite(summary["final_loss"]) and got[-1]["lm_loss"] < got[0]["lm_loss"]
  assert all(np.isfinite(r["grad_norm"]) == (f == 0) for r, f in zip(got, flags))
  assert f"skipped {counts[-1]}" in out.getvalue() and "scale " in out.getvalue()
  # The scale state is checkpointed: a resumed run logs the same rows.
  part = tmp_path / "part"
  loop.train(config(12), part)
  loop.train(config(24), part, resume=True)
  keys = ("step", "loss", "loss_scale", "skipped_steps", "lr")
  assert [[r[k] for k in keys] for r in rows(part)] == [[r[k] for k in keys] for r in got]


@pytest.mark.slow
def test_fp16_run_stops_when_the_scale_would_fall_below_its_minimum(tmp_path):
  c = small_config(4, loss_scale="dynamic", loss_scale_init=2.0**60,
                   loss_scale_min=2.0**59)
  c.model_overrides.dtype = "float16"
  with pytest.raises(loop.NonFiniteError, match=r"step 2: .*loss scale at its minimum"):
    loop.train(c, tmp_path)
  assert [(r["step"], r["skipped_steps"], r["loss_scale"]) for r in rows(tmp_path)] == [
      (1, 1, 2.0**59)]


# --- FP8 parameter gather ----------------------------------------------------------------


# Tiny model (mc.tiny: vocab 320, d 64, 3 layers, layer 0 dense with width 96, layers 1-2
# MoE with 8 experts of width 32 and one shared expert), counted by hand:
#   matrices: embedding 320x64 + head 64x320 = 40960 (3 + 3 blocks of 128x128);
#     attention 4 x 64x64 per layer = 3 x 16384 (4 blocks per layer);
#     dense MLP 2 x 64x96 + 96x64 = 18432 (3 blocks);
#     per MoE layer: router 64x8 = 512 (1), experts 3 x 8x64x32 = 49152 (3 x 8 per-expert
#     blocks), shared 2 x 64x32 + 32x64 = 6144 (3): 55808 (28 blocks)
#   -> 40960 + 49152 + 18432 + 2 x 55808 = 220160 elements, 6 + 12 + 3 + 56 = 77 blocks;
#   vectors: final norm 64 + 2 norms x 64 x 3 layers = 448 elements.
TINY_BF16_BYTES = 2 * (220160 + 448)
TINY_FP8_BYTES = 220160 + 4 * 77 + 2 * 448


@pytest.mark.slow
def test_run_with_fp8_gather_and_bf16_state_logs_memory_and_trains(tmp_path):
  out = io.StringIO()
  c = small_config(3, fp8_param_gather=True, moments="bfloat16", master_weights="bfloat16")
  summary = loop.train(c, tmp_path, stream=out)
  text = out.getvalue()
  assert text.count("fp8_param_gather:") == 1
  assert f"{TINY_BF16_BYTES / 2**30:.4g} GiB in BF16" in text
  assert f"saves {(TINY_BF16_BYTES - TINY_FP8_BYTES) / 2**30:.4g} GiB" in text
  assert np.isfinite(summary["final_loss"])
  meta = checkpoint.saved_meta(tmp_path / "checkpoints", 3)
  assert meta["digests"]["dtypes"]["params/norm/weight"] == "bfloat16"
  assert meta["digests"]["dtypes"]["opt_state/1/0/nu/norm/weight"] == "bfloat16"
