"""The model interface (fp8jax.models.api), the rules-policy text, and training any
registered model through it."""

import json
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp8jax.models import api, registry
from fp8jax.train import checkpoint as ckpt_lib
from fp8jax.train import run_config
from fp8jax.train import step as step_lib

REPO = pathlib.Path(__file__).resolve().parents[2]

TOKENS = jax.random.randint(jax.random.key(1), (2, 16), 0, 320, dtype=jnp.int32)


@pytest.mark.slow
def test_a_dense_model_trains_a_step_with_no_aux_loss():
  model = registry.get("llama:tiny")
  tx = optax.adamw(1e-3)
  state = step_lib.seeded_init(model, tx)(0)
  with pytest.raises(ValueError, match="does not store its layers stacked"):
    step_lib.seeded_init(model, tx, stacked=True)
  step = jax.jit(step_lib.make_train_step(model, tx, model.policy("gemm:mxfp8"),
                                          with_routing=True))
  new, metrics = step(state, TOKENS)
  assert bool(metrics["finite"]) and float(metrics["aux_loss"]) == 0.0
  assert metrics["routing"] == {} and int(new.step) == 1


def _config(**changes):
  c = run_config.defaults()
  c.optim.warmup_steps = 1
  for key, value in changes.items():
    c[key] = value
  return c


def test_run_config_builds_the_model_and_refuses_what_it_lacks():
  c = _config(model="llama:tiny", policy="gemm:fp32_blockwise")
  model, policy = run_config.check(c)
  assert model.name == "llama:tiny" and isinstance(policy, api.Variant)
  for key, value, match in (("moe_impl", "pallas", "no options"),
                            ("scan_layers", True, "no options")):
    bad = _config(model="llama:tiny")
    bad.train[key] = value
    with pytest.raises(ValueError, match=match):
      run_config.check(bad)
  bad = _config(model="llama:tiny", policy="attn@0:e4m3")  # DeepSeek's grammar
  with pytest.raises(ValueError, match="bad policy term"):
    run_config.check(bad)


@pytest.mark.slow
def test_the_train_binary_trains_resumes_and_records_a_llama(tmp_path):
  work = tmp_path / "llama"
  common = [sys.executable, "-m", "fp8jax.experiments.train",
            f"--config={REPO / 'experiments/configs/train_llama_tiny.py'}",
            f"--workdir={work}", "--config.optim.warmup_steps=1",
            "--config.optim.total_steps=10", "--config.train.save_every=2",
            "--config.train.log_every=2"]
  env = {"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "FP8JAX_COMPILE_CACHE": "off"}
  out = subprocess.run([*common, "--config.train.steps=4"], env=env, capture_output=True,
                       text=True, timeout=600, cwd=REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  out = subprocess.run([*common, "--config.train.steps=6", "--resume",
                        "--config.policy=gemm:fp32_blockwise", "--allow_policy_change"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [2, 4, 6]
  assert all(np.isfinite(r["loss"]) and r["aux_loss"] == 0.0 for r in rows)
  assert "weight_norm/attn_q" in rows[0] and "weight_norm/mlp" in rows[0]
  steps = sorted(int(p.name) for p in (work / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [0, 2, 4, 6]
  assert ckpt_lib.saved_policy(work / "checkpoints", 4)["expression"] == "bf16"
  saved = ckpt_lib.saved_policy(work / "checkpoints", 6)
  assert saved["expression"] == "gemm:fp32_blockwise" and saved["kind"] == "rules"

  # compare, branch and report on the run's BF16 checkpoints, through the binaries
  def run(module, *flags):
    out = subprocess.run([sys.executable, "-m", f"fp8jax.experiments.{module}", *flags],
                         env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]

  compare, branch = tmp_path / "compare", tmp_path / "branch"
  policies = r"--policies=gemm:mxfp8,gemm:fp32_blockwise@layers/\d+/mlp/.*"
  run("compare", f"--train_workdir={work}", f"--out={compare}", policies, "--steps=0,4",
      "--batches=1", "--batch_size=4")
  run("branch", f"--train_workdir={work}", f"--out={branch}", policies, "--from_steps=2",
      "--k=2")
  run("report", f"--results={compare}", f"--branch={branch}")
  rows = [json.loads(line) for line in (compare / "rows.jsonl").read_text().splitlines()]
  assert {r["policy"] for r in rows} == {"gemm:mxfp8", r"gemm:fp32_blockwise@layers/\d+/mlp/.*",
                                         "floor"} and len(rows) == 6
  mlp_only = [r for r in rows if r["policy"].endswith("mlp/.*")]
  assert all(0 < r["share_direct"] < 1 for r in mlp_only)  # the MLPs' share, from the rules
  report = (compare / "report.md").read_text()
  # the top-10 modules named by llama's classifier, not DeepSeek-MoE's ("other", "router")
  assert re.search(r"\bmlp \d", report) and "router" not in report
  assert "routing.png" not in report  # no router, no routing figure
  lines = [json.loads(line) for line in (branch / "branches.jsonl").read_text().splitlines()]
  assert {b["branch"] for b in lines} == {"bf16", "noise", "gemm:mxfp8",
                                          r"gemm:fp32_blockwise@layers/\d+/mlp/.*"}
  # the site grid of a model that names its site modules: the report's questions answer
  grid = tmp_path / "grid"
  run("compare", f"--train_workdir={work}", f"--out={grid}",
      "--policies=sites_small,noise(mlp_l0-1_e4m3)", "--steps=0,4", "--batches=1",
      "--batch_size=4")
  run("report", f"--results={grid}")
  meta = json.loads((grid / "meta.json").read_text())
  assert meta["policies"]["mlp_l0_e4m3"]["record"]["cell"] == {
      "module": "mlp", "depth": "l0", "format": "e4m3"}
  assert meta["policies"]["noise(mlp_l0-1_e4m3)"]["kind"] == "control"
  assert meta["policies"]["noise(mlp_l0-1_e4m3)"]["control_of"] == "mlp_l0-1_e4m3"
  report = (grid / "report.md").read_text()
  assert "Module sensitivity: attention vs MLP" in report
  assert "## Against noise-matched controls" in report and "noise(mlp_l0-1_e4m3)" in report
  assert report.count("Not available") == 1  # only the format-width question (no recipes)


@pytest.mark.parametrize("name,kw,want", [
    ("deepseek_moe:tiny", {}, "bf16"), ("llama:tiny", {}, "bf16"),
    ("llama:tiny", {"overrides": {"dtype": "float32"}}, "fp32")])
def test_the_reference_precision_is_read_from_the_model(name, kw, want):
  """From the baseline's own GEMMs (an abstract trace): DeepSeek-MoE's router computes in
  FP32, a sliver of its multiply-adds; a Llama set to compute in FP32 says so."""
  got = registry.get(name, **kw).reference_precision(jax.ShapeDtypeStruct((2, 16), jnp.int32))
  assert got["precision"] == want and got["gemm_share"][want] > 0.99
  assert sum(got["gemm_share"].values()) == pytest.approx(1.0)


def test_gemm_precisions_weigh_each_gemm_by_its_multiply_adds():
  def fn(a, b, c, d, i):
    y = jnp.einsum("bmk,bkn->bmn", a, b)   # 2 x 4 x 2 outputs of 8 products: 128, bf16
    z = c @ d                              # 4 x 5 outputs of 3 products: 60, fp32
    return y, z, i @ i                     # an integer product: not a floating GEMM
  s = jax.ShapeDtypeStruct
  got = api.gemm_precisions(fn, s((2, 4, 8), jnp.bfloat16), s((2, 8, 2), jnp.bfloat16),
                            s((4, 3), jnp.float32), s((3, 5), jnp.float32),
                            s((3, 3), jnp.int32))
  assert got == pytest.approx({"bf16": 128 / 188, "fp32": 60 / 188}, abs=1e-6)
  assert list(got) == ["bf16", "fp32"]  # the larger share first
  def scanned(x, w, v):  # 3 x 32 fp16 multiply-adds in the scan, 48 fp32 ones outside
    h = jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=3)[0]
    return h.astype(jnp.float32) @ v
  got = api.gemm_precisions(scanned, s((2, 4), jnp.float16), s((4, 4), jnp.float16),
                            s((4, 6), jnp.float32))
  assert got == pytest.approx({"fp16": 96 / 144, "fp32": 48 / 144}, abs=1e-6)
  assert api.gemm_precisions(lambda x: x * 2, s((3,), jnp.float32)) == {}


def test_a_model_without_gemms_takes_its_params_precision():
  from fp8jax.metrics import paths  # pylint: disable=import-outside-toplevel
  model = api.Model(
      name="scale", abstract_params=lambda: {"w": jax.ShapeDtypeStruct((4,), jnp.bfloat16),
                                             "b": jax.ShapeDtypeStruct((2,), jnp.float32)},
      apply=lambda p, x, policy, **_: (x * p["w"] + p["b"][0], {}), loss=jnp.mean,
      baseline=None, classifier=paths.Classifier.from_patterns({"w": "^w"}))
  got = model.reference_precision(jnp.ones((2, 4), jnp.float32))
  assert got == {"precision": "bf16", "gemm_share": {}}
