"""The deterministic mode's plumbing on the CPU (the GPU evidence is in docs/determinism.md):
the model's gradient with and without the mode (the one-hot-GEMM embedding gradient itself:
tests/models/test_embedding.py), and the run config field reaching the training step."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.models import config, deepseek_moe


@pytest.mark.slow
def test_model_gradient_in_the_deterministic_mode():
  cfg = config.tiny()
  params = deepseek_moe.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, cfg.vocab_size)

  def grads(det):
    def loss(p):
      logits, aux = deepseek_moe.apply(p, tokens, cfg, deterministic=det)
      return deepseek_moe.lm_loss(logits, tokens) + aux["aux_loss"]
    return jax.jit(jax.grad(loss))(params)

  plain, det = grads(False), grads(True)
  for path, a in jax.tree_util.tree_leaves_with_path(plain):
    b = det
    for k in path:
      b = b[k.key]
    if "embed_tokens" in jax.tree_util.keystr(path):  # the plain scatter-add sums a
      # repeated token's rows in bfloat16 (the compute dtype), the GEMM in float32
      np.testing.assert_allclose(b, a, rtol=0, atol=2**-7 * float(jnp.max(jnp.abs(a))))
    else:  # nothing else changes
      np.testing.assert_array_equal(b, a)


@pytest.mark.slow
def test_the_mode_sets_its_xla_flag_before_the_first_computation(tmp_path):
  """In a fresh process a deterministic run adds the flag to XLA_FLAGS and records the
  mode; in this one (backends started, CPU) it is too late and harmless."""
  from fp8jax.train import determinism
  code = (
      "import os, sys\n"
      "from fp8jax.train import loop, run_config\n"
      "cfg = run_config.defaults()\n"
      "cfg.train.steps, cfg.optim.warmup_steps, cfg.train.deterministic = 2, 1, True\n"
      "loop.train(cfg, sys.argv[1])\n"
      "print(os.environ['XLA_FLAGS'])\n")
  out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu",
                                                    "XLA_FLAGS": ""})
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split() == [determinism.FLAG]
  assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["deterministic"]
  jnp.ones(1).block_until_ready()  # this process's backends run: too late for the flag
  assert determinism.set_mode(True) == {"deterministic": True}  # no error, no warning on CPU
  assert determinism.FLAG not in os.environ.get("XLA_FLAGS", "").split()


@pytest.mark.slow
def test_sweep_in_the_deterministic_mode(train_run, tmp_path):
  """The sweep records the mode, and on a CPU its rows match the default mode's up to the
  embedding gradient's summation order."""
  from fp8jax.study.common import results_io
  from fp8jax.study.comparison import sweep
  windows = sweep.Windows(offsets=(0,), batches=1, batch_size=4)
  rows = {}
  for det in (False, True):
    out = tmp_path / f"det{det}"
    sweep.run(train_run, out, policies=["attn_l0_e4m3"], steps=[4], windows=windows,
              deterministic=det)
    assert json.loads((out / "meta.json").read_text())["deterministic"] is det
    rows[det] = {r["policy"]: r for r in results_io.read(out / "rows.jsonl")}
  for policy in ("attn_l0_e4m3", "floor"):
    assert rows[True][policy]["rel_err"] == pytest.approx(rows[False][policy]["rel_err"],
                                                          rel=1e-2)
    assert rows[True][policy]["loss_fp8"] == rows[False][policy]["loss_fp8"]  # forward: same


@pytest.mark.slow
def test_branch_follows_the_run_or_its_own_flag(train_run, tmp_path):
  """Branches run in the training run's mode unless told otherwise; meta records the mode,
  and on a CPU the two modes' branch losses agree."""
  from fp8jax.study.branches import branch
  from fp8jax.study.common import results_io
  rows = {}
  for det in (None, True):
    out = tmp_path / f"det{det}"
    branch.run(train_run, out, policies=["bf16"], from_steps=[4],
               branches=branch.Branches(k=1, noise=1), deterministic=det)
    assert json.loads((out / "meta.json").read_text())["deterministic"] is bool(det)
    rows[det] = {r["branch"]: r for r in results_io.read(out / "branches.jsonl")}
  assert rows[True].keys() == rows[None].keys() and rows[True]
  for name, row in rows[True].items():
    for key, value in row.items():
      if isinstance(value, float) and "loss" in key:
        assert value == pytest.approx(rows[None][name][key], rel=1e-4, abs=1e-6), key
