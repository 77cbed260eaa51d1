"""The Mixtral-style sparse MoE (fp8jax.models.mixtral): its router and experts against a
NumPy float64 reference, its classifier's expert grouping, its routing statistics, and the
pipeline (train, compare, branch, report) through the binaries with the report's routing
and per-expert sections fed by the model's own router choices."""

import dataclasses
import json
import math
import pathlib
import subprocess
import sys

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax import metrics
from fp8jax.metrics import paths as paths_lib
from fp8jax.models import llama, mixtral, registry

REPO = pathlib.Path(__file__).resolve().parents[2]
F32 = dataclasses.replace(mixtral.CONFIGS["tiny"], dtype="float32")


def _silu(x):
  return x / (1.0 + np.exp(-x))


def test_router_top2_experts_and_balance_loss_against_numpy():
  moe = nnx.jit(lambda: mixtral.SparseMoE(F32, nnx.Rngs(0)))()
  x = np.random.default_rng(1).standard_normal((2, 8, F32.hidden_size)).astype(np.float32)
  x = x.astype(np.float64)  # float32 values (NumPy's: jax.random's compiles a sampler)
  out, routing, loss = nnx.jit(lambda m, v: m(v))(moe, jnp.asarray(x, jnp.float32))
  router = np.asarray(moe.router[...], np.float64)
  gate, up, down = (np.asarray(w[...], np.float64) for w in
                    (moe.experts.gate, moe.experts.up, moe.experts.down))
  flat = x.reshape(-1, F32.hidden_size)
  logits = flat @ router
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  ids = np.argsort(-probs, axis=-1, kind="stable")[:, :2]
  top = np.take_along_axis(probs, ids, -1)
  weights = top / top.sum(-1, keepdims=True)  # Mixtral renormalises the top-2
  np.testing.assert_array_equal(np.asarray(routing["topk_ids"]).reshape(-1, 2), ids)
  np.testing.assert_allclose(np.asarray(routing["topk_weights"]).reshape(-1, 2), weights,
                             rtol=1e-5)
  counts = np.bincount(ids.ravel(), minlength=F32.num_experts)
  np.testing.assert_array_equal(routing["expert_counts"], counts)
  want = np.zeros_like(flat)
  for t in range(flat.shape[0]):
    for j, e in enumerate(ids[t]):
      h = _silu(flat[t] @ gate[e]) * (flat[t] @ up[e])
      want[t] += weights[t, j] * (h @ down[e])
  np.testing.assert_allclose(np.asarray(out).reshape(want.shape), want, rtol=2e-4, atol=1e-6)
  # Mixtral's (HF) load-balancing loss: coef * E * sum_e (tokens to e / T) * mean prob of e
  hf = F32.num_experts * np.sum(counts / flat.shape[0] * probs.mean(0))
  np.testing.assert_allclose(float(loss), F32.router_aux_loss_coef * hf, rtol=1e-5)


def test_classifier_names_experts_and_groups_per_expert_metrics():
  model = registry.get("mixtral:tiny")
  flat = paths_lib.flatten(model.abstract_params())
  cls = model.classifier
  got = {p: (cls.module_of(p), cls.layer_of(p), cls.is_expert_stack(p)) for p in flat}
  for i in range(2):
    for w in ("gate", "up", "down"):
      assert got[f"layers/{i}/mlp/experts/{w}"] == ("routed_experts", i, True)
      assert flat[f"layers/{i}/mlp/experts/{w}"].shape[0] == 4  # the leading expert axis
    assert got[f"layers/{i}/mlp/router"] == ("router", i, False)
    assert got[f"layers/{i}/attn/q/kernel"] == ("attn_q", i, False)
    assert got[f"layers/{i}/mlp_norm/weight"] == ("norms", i, False)
  assert got["head/kernel"] == ("head", None, False)
  assert got["embed/embedding"] == ("embedding", None, False)
  assert {cls.group_of(m) for m in ("router", "routed_experts")} == {"moe"}
  assert sum(flag for _, _, flag in got.values()) == 6
  table = paths_lib.Classifier.from_table(cls.to_table(flat))  # as meta.json keeps it
  assert table.is_expert_stack("layers/1/mlp/experts/up") and table.module_of(
      "layers/1/mlp/experts/up") == "routed_experts"
  # one expert's gradient changed: the per-expert metrics single it out, in its layer
  g = jax.tree.map(lambda s: jnp.ones(s.shape, jnp.float32), model.abstract_params())
  g2 = jax.tree.map(lambda x: x, g)
  g2["layers"][1]["mlp"]["experts"]["up"] = g["layers"][1]["mlp"]["experts"]["up"].at[2].add(1.0)
  res = jax.jit(metrics.compare_grads, static_argnames="classifier")(g, g2, classifier=cls)
  diff = {k: np.asarray(v["diff_norm"]) for k, v in res["by_expert"].items()}
  assert set(diff) == {"0", "1"} and not diff["0"].any()
  np.testing.assert_allclose(diff["1"], [0, 0, math.sqrt(64 * 128), 0], rtol=1e-6)


def test_routing_statistics_shapes_config_and_policies():
  model = registry.get("mixtral:tiny")
  tokens = jax.ShapeDtypeStruct((3, 16), jnp.int32)
  logits, aux = jax.eval_shape(lambda p, t: model.apply(p, t, model.baseline),
                               model.abstract_params(), tokens)
  assert logits.shape == (3, 16, 320) and logits.dtype == jnp.float32
  assert aux["aux_loss"].shape == () and set(aux["routing"]) == {0, 1}
  for r in aux["routing"].values():
    assert {k: (v.shape, v.dtype) for k, v in r.items()} == {
        "topk_ids": ((3, 16, 2), jnp.int32), "topk_weights": ((3, 16, 2), jnp.float32),
        "expert_counts": ((4,), jnp.int32)}
  # the experts' grouped GEMMs are a module of the rules; the router is out of their reach
  policy = model.policy(r"gemm:mxfp8@layers/\d+/mlp/experts")
  assert model.direct(policy) == {("routed_experts", 0), ("routed_experts", 1)}
  with pytest.raises(ValueError, match="router"):
    model.policy("gemm:mxfp8@layers/0/mlp/router")
  cfg = mixtral.CONFIGS["tiny"]
  dense = llama.flops_per_token(dataclasses.replace(cfg, intermediate_size=2 * 128), 64)
  assert model.flops_per_token(64) == dense + 6 * 2 * 64 * 4
  assert registry.get("mixtral:small").config.num_experts == 8
  for bad, match in (({"top_k": 5}, "top_k 5"), ({"depth": 2}, "unknown model_overrides")):
    with pytest.raises(ValueError, match=match):
      registry.get("mixtral:tiny", bad)


def _table(report: str, header: str) -> list[list[str]]:
  """The cells of the markdown table whose header line starts with ``header``."""
  lines = report.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith(header))
  rows = []
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    rows.append([c.strip() for c in line.strip("|").split("|")])
  return rows


@pytest.mark.slow
def test_the_pipeline_reports_routing_and_experts_from_the_models_router(tmp_path):
  env = {"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "FP8JAX_COMPILE_CACHE": "off"}

  def run(module, *flags):
    out = subprocess.run([sys.executable, "-m", f"fp8jax.experiments.{module}", *flags],
                         env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]

  work, compare, branch = tmp_path / "train", tmp_path / "compare", tmp_path / "branch"
  run("train", f"--config={REPO / 'experiments/configs/train_mixtral_tiny.py'}",
      f"--workdir={work}", "--config.optim.warmup_steps=1", "--config.optim.total_steps=10",
      "--config.train.save_every=2", "--config.train.log_every=2", "--config.train.steps=4")
  logs = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
  assert all(np.isfinite(r["loss"]) and r["aux_loss"] > 0 for r in logs)
  experts_only = r"gemm:mxfp8@layers/\d+/mlp/experts"
  run("compare", f"--train_workdir={work}", f"--out={compare}", "--steps=0,4", "--batches=1",
      "--batch_size=4", "--nofloor", f"--policies=bf16,gemm:nvfp4_recipe,{experts_only}")
  run("branch", f"--train_workdir={work}", f"--out={branch}", "--policies=gemm:nvfp4_recipe",
      "--from_steps=2", "--k=2")
  run("report", f"--results={compare}", f"--branch={branch}")

  rows = {(r["step"], r["policy"]): r for r in
          map(json.loads, (compare / "rows.jsonl").read_text().splitlines())}
  assert len(rows) == 6
  frac = lambda r, lay: r[f"routing/{lay}/topk_set_diff_frac"]  # noqa: E731
  for step in (0, 4):
    bf16, fp4, experts = (rows[(step, p)] for p in ("bf16", "gemm:nvfp4_recipe", experts_only))
    assert bf16["rel_err"] == 0 and frac(bf16, 0) == frac(bf16, 1) == 0  # the control
    assert all(0 <= frac(fp4, lay) < 0.5 for lay in (0, 1)) and frac(fp4, 0) + frac(fp4, 1) > 0
    assert frac(experts, 0) == 0  # layer 0's router reads no quantized GEMM's output
  details = [json.loads(line) for line in (compare / "details.jsonl").read_text().splitlines()]
  for d in details:
    assert set(d["by_expert"]) == set(d["expert_tokens"]) == {"0", "1"}
    assert all(sum(c) == 4 * 128 * 2 for c in d["expert_tokens"].values())  # B x S x top-2
    for layer, v in d["by_expert"].items():
      assert len(v["diff_norm"]) == 4 and np.isfinite(v["rel_err"]).all()
      used = np.asarray(d["expert_tokens"][layer]) > 0  # an expert no token chose: no gradient
      if d["policy"] == "gemm:nvfp4_recipe":
        assert (np.asarray(v["diff_norm"])[used] > 0).all()
      elif d["policy"] == "bf16":
        assert not np.any(v["diff_norm"])

  report = (compare / "report.md").read_text()
  assert "## Routing and experts" in report and "routing.png" in report
  routing = {r[0]: r[1:] for r in _table(report, "| policy | layer 0 | layer 1 | mean |")}
  assert routing["bf16"] == ["0", "0", "0"]
  assert float(routing["gemm:nvfp4_recipe"][2]) > 0
  per_expert = _table(report, "| policy | layer | expert | tokens (BF16) |")
  fp4 = [r for r in per_expert if r[0] == "gemm:nvfp4_recipe"]
  assert len(fp4) == 8 and {(r[1], r[2]) for r in fp4} == {
      (str(lay), str(e)) for lay in (0, 1) for e in range(4)}
  cells = [float(c) for r in fp4 for c in r[4:6]]  # diff_norm and rel_err
  assert all(math.isfinite(c) and c >= 0 for c in cells) and sum(c > 0 for c in cells) >= 12
  assert all(float(r[4]) == 0 for r in per_expert if r[0] == "bf16")
  lines = [json.loads(line) for line in (branch / "branches.jsonl").read_text().splitlines()]
  assert {b["branch"] for b in lines} == {"bf16", "noise", "gemm:nvfp4_recipe"}
  assert all(np.isfinite(v) for b in lines for v in b["routing_diff"])
