"""A language model fp8jax did not write, from PyPI, through every binary: NanoMoE of
``nano-moe-jax`` (``nano_moe:tiny``, a Flax Linen sparse-MoE LM) trained in BF16, compared
with an 8-bit and a 4-bit recipe on its checkpoints, branched off, validated over two
seeds and reported, at tiny size on the CPU."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("nano_moe", reason="nano-moe-jax is in the dev extra")
pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]
# The shipped config at the smallest size that still routes: one block of two experts,
# top-1 (8 GEMMs on parameters: each recipe's program compiles in seconds).
CONFIG = """
from fp8jax.experiments.configs import train_nano_moe_tiny

def get_config():
  c = train_nano_moe_tiny.get_config()
  c.model_overrides.n_layers, c.model_overrides.n_experts, c.model_overrides.top_k = 1, 2, 1
  return c
"""
SMALL = ["--config.train.steps=4", "--config.train.save_every=2", "--config.train.log_every=2",
         "--config.optim.warmup_steps=1", "--config.data.seq_len=32",
         "--config.data.global_batch=4"]
GRID = "--policies=gemm:mxfp8,gemm:nvfp4"


def run(module: str, *flags: str) -> None:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-m", f"fp8jax.experiments.{module}", *flags],
                       env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
  assert out.returncode == 0, f"{module}: {out.stderr[-3000:]}"


def test_nano_moe_trains_compares_branches_validates_and_reports(tmp_path):
  config = tmp_path / "nano_moe_smallest.py"
  config.write_text(CONFIG)
  train, compare = tmp_path / "train", tmp_path / "compare"
  branch, validate = tmp_path / "branch", tmp_path / "validate"
  run("train", f"--config={config}", f"--workdir={train}", *SMALL)
  run("compare", f"--train_workdir={train}", f"--out={compare}", GRID, "--steps=0,4",
      "--batches=1", "--batch_size=4")
  run("branch", f"--train_workdir={train}", f"--out={branch}", GRID, "--from_steps=2",
      "--k=2")
  run("validate", f"--config={config}", "--config.train.checkpoints=False", *SMALL,
      f"--out={validate}", "--recipes=bf16,gemm:mxfp8", "--seeds=0-1", "--group_seeds")
  run("report", f"--results={compare}", f"--branch={branch}",
      f"--validation={validate / 'summary.json'}")

  logged = [json.loads(line) for line in (train / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in logged] == [2, 4] and all(r["aux_loss"] > 0 for r in logged)
  rows = [json.loads(line) for line in (compare / "rows.jsonl").read_text().splitlines()]
  grads = [r for r in rows if r.get("scope", "global") == "global"]
  assert {r["policy"] for r in grads} == {"gemm:mxfp8", "gemm:nvfp4", "floor"}
  assert "routing/0/topk_set_diff_frac" in rows[0]  # its router's top-k choice
  meta = json.loads((compare / "meta.json").read_text())
  assert "nano-moe-jax" in json.dumps(meta)
  modules = {row[0] for row in meta["classes"]["paths"].values()}
  assert {"attn_qkv", "router", "routed_experts", "head"} <= modules and "other" not in modules
  lines = [json.loads(line) for line in (branch / "branches.jsonl").read_text().splitlines()]
  assert {b["branch"] for b in lines} == {"bf16", "noise", "gemm:mxfp8", "gemm:nvfp4"}
  assert len(list((validate / "runs").iterdir())) == 4

  report = (compare / "report.md").read_text()
  assert "nano_moe:tiny" in report and "nano-moe-jax" in report
  sections = report.split("\n## ")
  for title in ("Summary per policy", "Against the noise floor", "5. Format width",
                "Does the one-step perturbation predict the trajectory?"):
    body = next(s for s in sections if s.startswith(title))
    assert "Not available" not in body.split("\n", 2)[-1][:200], title
  # the format-width section names the real precisions, 8 and 4 bits
  width = next(s for s in sections if s.startswith("5. Format width"))
  assert "| gemm:mxfp8 (`mxfp8`) | 8 |" in width and "| gemm:nvfp4 (`nvfp4`) | 4 |" in width
  # grouped by NanoMoE's classifier, not DeepSeek-MoE's
  assert "attn_qkv" in report and "routed_experts" in report and "shared_experts" not in report
  assert "### Full training runs" in report
