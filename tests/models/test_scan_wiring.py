"""``scan_layers`` reaches the model from the training step (``train.scan_layers``), the
paired evaluator (DeepSeek-MoE's option ``scan``) and ``compare
--scan_layers``; a scanned training run logs the loop's losses bit for bit (where XLA rounds
every BF16 intermediate, as in ``tests/models/test_layer_scan.py``)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import optax
import pytest

from fp8jax.models import config as config_lib
from fp8jax.models import deepseek_model, deepseek_moe
from fp8jax.models import policy as policy_lib
from fp8jax.train import run_config
from fp8jax.train import step as step_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
CFG = config_lib.tiny(num_hidden_layers=4)  # layer 0 dense, 1-3 MoE: one run of 3


def _model(scan: bool):
  return deepseek_model.model(CFG, deepseek_model.Options(scan=scan or None))


def _scans(fn, *args) -> int:
  return sum(e.primitive.name == "scan" for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns)


def test_the_training_step_scans_when_asked():
  params = deepseek_moe.abstract_params(CFG)
  tx = optax.adamw(1e-3)
  state = jax.eval_shape(lambda p: step_lib.init_state(p, tx), params)
  tokens = jax.ShapeDtypeStruct((2, 8), "int32")
  for scan, want in ((False, 0), (True, 1)):
    step = step_lib.make_train_step(_model(scan), tx)
    # the forward's scan, and its transpose in the backward pass
    assert (_scans(step, state, tokens) > 0) == bool(want), scan
  assert run_config.defaults().train.scan_layers is False


def test_the_evaluators_model_scans_when_asked():
  params = deepseek_moe.abstract_params(CFG)
  tokens = jax.ShapeDtypeStruct((2, 8), "int32")
  for scan in (False, True):
    model = _model(scan)
    n = _scans(lambda p, t, m=model: m.apply(p, t, policy_lib.BF16)[0], params, tokens)
    assert n == (1 if scan else 0)


@pytest.mark.slow
def test_a_scanned_run_logs_the_loops_losses(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "FP8JAX_COMPILE_CACHE": "off",
         "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_allow_excess_precision=false"}
  losses = {}
  for scan in (False, True):
    work = tmp_path / f"scan_{scan}"
    out = subprocess.run(
        [sys.executable, "-m", "fp8jax.experiments.train",
         f"--config={REPO / 'experiments/configs/train_tiny.py'}", f"--workdir={work}",
         "--config.train.steps=3", "--config.optim.warmup_steps=1",
         "--config.train.log_every=1", "--config.train.checkpoints=False",
         "--config.train.moe_impl=dispatch", "--config.policy=gemm:fp32_blockwise@1-2",
         f"--config.train.scan_layers={scan}"],
        env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    losses[scan] = [(r["step"], r["loss"], r["grad_norm"]) for r in rows]
    assert json.loads((work / "config.json").read_text())["train"]["scan_layers"] is scan
  assert len(losses[False]) == 3
  # The losses bit for bit; the logged gradient norm to float32 rounding: XLA may reduce a
  # layer's slice of a stacked gradient in another order than the separate array.
  assert [(s, loss) for s, loss, _ in losses[True]] == [(s, loss) for s, loss, _ in losses[False]]
  for (_, _, scanned), (_, _, looped) in zip(losses[True], losses[False], strict=True):
    assert abs(scanned - looped) <= 1e-6 * looped
