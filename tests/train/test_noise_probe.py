"""``train.noise_probe_every``: the BF16 gradient's norm against the quantization noise's
along a run (arXiv 2505.19115's sqrt(3) criterion), checked against gradients taken here
and norms in NumPy float64."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from fp8jax.models import config as config_lib
from fp8jax.models import deepseek_model, deepseek_moe
from fp8jax.models import policy as policy_lib
from fp8jax.train import noise_probe, run_config

REPO = pathlib.Path(__file__).resolve().parents[2]
CFG = config_lib.tiny(num_hidden_layers=2)
MODEL = deepseek_model.model(CFG)


def _grad(params, tokens, policy):
  def f(p):
    logits, aux = deepseek_moe.apply(p, tokens, CFG, policy)
    return deepseek_moe.lm_loss(logits, tokens) + aux["aux_loss"]
  return [np.asarray(g, np.float64) for g in jax.tree.leaves(jax.jit(jax.grad(f))(params))]


@pytest.mark.slow
def test_probe_against_separate_gradients():
  params = deepseek_moe.init(CFG, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, CFG.vocab_size)
  policy = policy_lib.parse_policy("attn@0-1:e5m2")
  got = jax.device_get(jax.jit(noise_probe.make_probe(MODEL, policy))(params, {}, tokens))
  ref, q = _grad(params, tokens, policy_lib.BF16), _grad(params, tokens, policy)
  signal = np.sqrt(sum(np.sum(g * g) for g in ref))
  noise = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(q, ref)))
  # BF16 gradients: XLA fuses the two programs differently, so last bits may differ
  assert got["probe/grad_norm"] == pytest.approx(signal, rel=2e-3)
  assert got["probe/noise_norm"] == pytest.approx(noise, rel=1e-2)
  assert got["probe/ratio"] == pytest.approx(signal / noise, rel=1e-2)
  assert 0 < noise < signal  # E5M2 perturbs the gradient, and less than its own size
  same = jax.device_get(jax.jit(noise_probe.make_probe(MODEL, policy_lib.BF16))(params, {},
                                                                              tokens))
  assert same["probe/noise_norm"] == 0 and same["probe/ratio"] == np.inf


def test_due_steps_crossing_and_config_checks():
  assert [s for s in range(1, 11) if noise_probe.is_due(s, 5)] == [5, 10]
  assert not any(noise_probe.is_due(s, 0) for s in range(1, 11))
  rows = [{"step": 10, "probe/ratio": 3.0}, {"step": 20}, {"step": 30, "probe/ratio": 1.7},
          {"step": 40, "probe/ratio": 1.2}]
  assert noise_probe.crossing(rows) == 30 and noise_probe.crossing(rows, 1.5) == 40
  assert noise_probe.crossing(rows[:2]) is None
  c = run_config.defaults()
  c.optim.warmup_steps = 10
  c.train.log_every, c.train.noise_probe_every = 10, 25
  with pytest.raises(ValueError, match="noise_probe_every must be 0 .off. or a positive "
                                       "multiple of train.log_every 10, got 25"):
    run_config.check(c)
  c.train.noise_probe_every = 20
  run_config.check(c)


@pytest.mark.slow
def test_a_probed_run_logs_the_ratio_on_its_probe_steps(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "FP8JAX_COMPILE_CACHE": "off"}
  out = subprocess.run(
      [sys.executable, "-m", "fp8jax.experiments.train",
       f"--config={REPO / 'experiments/configs/train_tiny.py'}", f"--workdir={tmp_path}",
       "--config.train.steps=4", "--config.optim.warmup_steps=1", "--config.train.log_every=1",
       "--config.train.checkpoints=False", "--config.policy=attn@0-3:e5m2",
       "--config.train.noise_probe_every=2"],
      env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  probed = [r["step"] for r in rows if "probe/ratio" in r]
  assert probed == [2, 4]
  for r in rows:
    if "probe/ratio" in r:
      assert r["probe/ratio"] == pytest.approx(r["probe/grad_norm"] / r["probe/noise_norm"],
                                               rel=1e-6)
      assert 0 < r["probe/noise_norm"] < r["probe/grad_norm"]
