"""The policy recorded with the checkpoints (resume under another policy fails before any
compute), runs without checkpoints, the step's routing output, and the shared step builder."""

import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.models import config as mc
from fp8jax.models import deepseek_model
from fp8jax.models import deepseek_moe as dm
from fp8jax.models import policy as policy_lib
from fp8jax.train import checkpoint, loop, optim, run_config
from fp8jax.train import mesh as mesh_lib
from fp8jax.train import step as step_lib
from tests.train_cases import ckpt_steps, rows, small_config

# --- the policy travels with the checkpoint ----------------------------------------------


def test_policy_record_is_complete_and_deterministic():
  expr = "attn@0-1:e4m3+moe@1:deepseek_v3+gemm:fp32_blockwise"
  rec = policy_lib.record(policy_lib.parse_policy(expr))
  assert rec == policy_lib.record(policy_lib.parse_policy(expr))
  assert json.loads(json.dumps(rec)) == rec
  assert rec["expression"] == rec["name"] == expr
  first = rec["rules"][0]
  assert first["site"] == "attn_out" and first["layers"] == [0, 1]
  assert first["spec"]["eps"] == 1e-12 and first["spec"]["format"] == "e4m3"
  assert rec["gemm"]["roles"]["weight"]["granularity"]["sizes"] == [128, 128]
  assert policy_lib.record(policy_lib.parse_policy("attn@0-1:e5m2")) != rec
  eps = policy_lib.PrecisionPolicy((policy_lib.SiteRule(
      "attn_out", (0,), fp8jax.QuantSpec(eps=1e-6)),), name="x")
  same = policy_lib.PrecisionPolicy((policy_lib.SiteRule(
      "attn_out", (0,), fp8jax.QuantSpec()),), name="x")
  assert policy_lib.record(eps) != policy_lib.record(same)  # epsilons count


def test_spec_fields_added_since_records_began_appear_only_when_set():
  """Records written before QuantSpec had ``four_over_six`` still match: its default is
  left out of every spec (site rules, cotangents, a GEMM recipe's roles)."""
  rec = policy_lib.record(policy_lib.parse_policy("attn@0:nvfp4+gemm:nvfp4_recipe"))
  text = json.dumps(rec)
  assert "four_over_six" not in text and '"sr_bits"' in text
  four = fp8jax.preset("nvfp4").replace(backward=None, four_over_six="mae")
  rec4 = policy_lib.record(policy_lib.PrecisionPolicy(
      (policy_lib.SiteRule("attn_out", (0,), four),), name="x"))
  spec = rec4["rules"][0]["spec"]
  assert spec["four_over_six"] == "mae" and "four_over_six_max" not in spec


@pytest.mark.slow
def test_resume_under_another_policy_fails_before_compute_unless_allowed(tmp_path):
  c = small_config(3)
  loop.train(c, tmp_path)
  rec = checkpoint.saved_policy(tmp_path / "checkpoints", 3)
  assert rec == policy_lib.record(policy_lib.BF16, "bf16")
  before = (rows(tmp_path), ckpt_steps(tmp_path), (tmp_path / "config.json").read_text())
  other = small_config(6)
  other.policy = "attn@0:e4m3"
  with pytest.raises(loop.PolicyMismatchError,
                     match=r"'bf16'.*'attn@0:e4m3'.*--allow_policy_change") as e:
    loop.train(other, tmp_path, resume=True)
  assert isinstance(e.value, ValueError)
  assert (rows(tmp_path), ckpt_steps(tmp_path),
          (tmp_path / "config.json").read_text()) == before
  out = io.StringIO()
  loop.train(other, tmp_path, resume=True, allow_policy_change=True, stream=out)
  assert "warning: --allow_policy_change" in out.getvalue()
  assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3, 4, 5, 6]
  assert checkpoint.saved_policy(tmp_path / "checkpoints", 3)["expression"] == "bf16"
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", 1)
  try:
    assert checkpoint.saved_policy(ckpt, 6)["expression"] == "attn@0:e4m3"
    described = checkpoint.saved_meta(ckpt, 6)[checkpoint.POLICY_RECORD]  # the structured one
    assert described["cell"] == {"module": "attn", "depth": "l0", "format": "e4m3"}
    assert checkpoint.saved_meta(ckpt, 3)[checkpoint.POLICY_RECORD]["sites"] == []
  finally:
    ckpt.close()


@pytest.mark.slow
def test_checkpoints_without_a_policy_record_resume_as_before(tmp_path):
  loop.train(small_config(3), tmp_path)
  for step in (0, 3):  # as written before the records existed
    path = tmp_path / "checkpoints" / str(step) / "meta" / "metadata"
    meta = json.loads(path.read_text())
    del meta[checkpoint.POLICY]
    path.write_text(json.dumps(meta))
  assert checkpoint.saved_policy(tmp_path / "checkpoints", 3) is None
  other = small_config(6)
  other.policy = "attn@0:e4m3"
  with pytest.raises(loop.PolicyMismatchError, match=r"'bf16'.*config.json.*'attn@0:e4m3'"):
    loop.train(other, tmp_path, resume=True)
  loop.train(small_config(6), tmp_path, resume=True)
  assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3, 4, 5, 6]


# --- runs without checkpoints, the routing output and the shared builders ----------------


@pytest.mark.slow
def test_run_without_checkpoints_writes_none(tmp_path):
  c = small_config(3)
  c.train.checkpoints = False
  summary = loop.train(c, tmp_path)
  assert not (tmp_path / "checkpoints").exists()
  assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3] and np.isfinite(summary["final_loss"])
  before = (tmp_path / "metrics.jsonl").read_bytes()
  with pytest.raises(FileExistsError, match="saved no checkpoint"):  # not overwritten
    loop.train(c, tmp_path)
  assert (tmp_path / "metrics.jsonl").read_bytes() == before


@pytest.mark.slow
def test_step_returns_the_forward_routing_on_request():
  cfg = mc.tiny(dtype="float32")
  tx = optim.optimizer(optim.OptimConfig(warmup_steps=1, total_steps=10))
  params = dm.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
  state = step_lib.init_state(params, tx)
  model = deepseek_model.model(cfg)
  _, plain = jax.jit(step_lib.make_train_step(model, tx))(state, tokens)
  _, m = jax.jit(step_lib.make_train_step(model, tx, with_routing=True))(state, tokens)
  assert "routing" not in plain
  want = dm.apply(params, tokens, cfg)[1]["routing"]
  assert sorted(m["routing"]) == [1, 2]  # the MoE layers
  for layer, r in m["routing"].items():
    assert r["topk_ids"].shape == (2, 16, cfg.num_experts_per_tok)
    assert int(r["expert_counts"].sum()) == 2 * 16 * cfg.num_experts_per_tok
    for key in ("topk_ids", "expert_counts"):
      np.testing.assert_array_equal(r[key], want[layer][key])
  assert float(m["loss"]) == float(plain["loss"])


@pytest.mark.slow
def test_build_step_reproduces_the_run(tmp_path):
  c = small_config(2, moments="bfloat16", loss_scale="dynamic", fp8_param_gather=True)
  loop.train(c, tmp_path)
  model, policy = run_config.check(c)
  mesh = mesh_lib.data_mesh()
  tx = loop.optimizer_for(c)
  init, _, sharding = loop.state_layout(c, model, tx, mesh)
  step = loop.build_step(c, model, tx, policy, mesh, sharding)
  data = loop.make_data(c, mesh, model.vocab_size)
  state, got = jax.jit(init, out_shardings=sharding)(), []
  for _ in range(2):
    state, m = step(state, mesh_lib.global_batch(next(data), mesh))
    got.append((float(m["loss"]), float(m["loss_scale"])))
  assert got == [(r["loss"], r["loss_scale"]) for r in rows(tmp_path)]
  assert state.loss_scale["scale"].dtype == jnp.float32
