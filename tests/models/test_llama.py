"""The Llama-style model (``fp8jax.models.llama``): its forward against a float64 NumPy
decoder, its config's checks, its parameter paths and FLOPs, and the model facade that
quantizes it by rules."""

import json

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax import rules as rules_lib
from fp8jax.metrics import paths as paths_lib
from fp8jax.models import llama, registry, rules_policy
from fp8jax.train import flops

TOKENS = jax.random.randint(jax.random.key(1), (2, 16), 0, 320, dtype=jnp.int32)


def _numpy_forward(p, tokens, cfg, attn_outputs=None):
  """Logits of the decoder the module docstring describes, in float64: pre-norm layers of
  grouped-query attention with rotate_half RoPE and a SwiGLU MLP, a final norm, a head;
  ``attn_outputs``: a list that gets each layer's attention output [B, S, d]."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  heads, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  b, s = tokens.shape

  def norm(x, w):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.rms_norm_eps) * w

  def rope(x):
    angle = np.arange(s)[:, None] * cfg.rope_theta ** (-np.arange(0, hd, 2) / hd)
    cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

  h = p["embed"]["embedding"][tokens]
  causal = np.tril(np.ones((s, s), bool))
  for i in range(cfg.num_layers):
    layer = p["layers"][i]
    x, a = norm(h, layer["attn_norm"]["weight"]), layer["attn"]
    q = rope((x @ a["q"]["kernel"]).reshape(b, s, heads, hd))
    k = rope((x @ a["k"]["kernel"]).reshape(b, s, kv, hd))
    v = (x @ a["v"]["kernel"]).reshape(b, s, kv, hd)
    k, v = (np.repeat(t, heads // kv, axis=2) for t in (k, v))  # head j reads kv j // G
    logits = np.where(causal, np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd), -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    out = np.einsum("bhqk,bkhd->bqhd", w / w.sum(-1, keepdims=True), v)
    attn = out.reshape(b, s, heads * hd) @ a["o"]["kernel"]
    if attn_outputs is not None:
      attn_outputs.append(attn)
    h = h + attn
    x, m = norm(h, layer["mlp_norm"]["weight"]), layer["mlp"]
    gate, up = x @ m["gate"]["kernel"], x @ m["up"]["kernel"]
    if cfg.swiglu_limit is not None:
      gate, up = np.minimum(gate, cfg.swiglu_limit), np.clip(up, -cfg.swiglu_limit,
                                                              cfg.swiglu_limit)
    h = h + (gate / (1 + np.exp(-gate)) * up) @ m["down"]["kernel"]
  return norm(h, p["norm"]["weight"]) @ p["head"]["kernel"]


@pytest.mark.parametrize("swiglu_limit", [None, 0.5])
def test_forward_matches_a_float64_numpy_decoder(swiglu_limit):
  model = registry.get("llama:tiny", {"dtype": "float32", "vocab_size": 48, "hidden_size": 32,
                                      "intermediate_size": 48, "swiglu_limit": swiglu_limit})
  cfg = model.config
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.num_layers) == (4, 2, 2)  # grouped heads
  rng = np.random.default_rng(0)
  # weights large enough that attention is far from uniform and the limit clamps
  params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) * (
      1.0 if len(s.shape) == 1 else 0.5)).astype(np.float32), model.abstract_params())
  tokens = rng.integers(0, cfg.vocab_size, (2, 7))
  with jax.default_matmul_precision("highest"):
    got, aux = model.apply(params, jnp.asarray(tokens), model.baseline)
  assert aux == {} and got.dtype == jnp.float32 and got.shape == (2, 7, 48)
  want = _numpy_forward(params, tokens, cfg)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.max(np.abs(want)))


def test_a_delayed_output_pushes_the_amax_of_the_float64_decoders_attention_output():
  """Layer 0's attention output under delayed scaling (history 3): each step's update (the
  gradient with respect to the histories) pushes that output's amax, as the NumPy decoder
  computes it before any quantization, newest first."""
  model = registry.get("llama:tiny", {"dtype": "float32", "vocab_size": 48, "hidden_size": 32,
                                      "intermediate_size": 48})
  policy = model.policy("output:e4m3/delayed(h=3)@layers/0/attn")
  state = model.delayed_init(policy)
  assert jax.tree.map(jnp.shape, state) == {"layers/0/attn": {0: {"fwd": (3,)}}}
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) * 0.5).astype(np.float32),
                        model.abstract_params())

  def loss(p, s, tokens):
    logits, _ = model.apply(p, tokens, policy, delayed=s)
    return model.loss(logits, tokens)

  update = jax.jit(jax.grad(loss, argnums=1))
  want = [0.0] * 3
  for _ in range(2):
    tokens = rng.integers(0, 48, (2, 7))
    with jax.default_matmul_precision("highest"):
      state = update(params, state, jnp.asarray(tokens))
    outputs = []
    _numpy_forward(params, tokens, model.config, outputs)
    want = [np.max(np.abs(outputs[0]))] + want[:-1]
    np.testing.assert_allclose(state["layers/0/attn"][0]["fwd"], want, rtol=1e-4)


@pytest.mark.parametrize("fields", [{"hidden_size": 60, "num_heads": 8},
                                    {"num_heads": 4, "num_kv_heads": 3}])
def test_heads_that_do_not_split_the_width_or_each_other_are_refused(fields):
  with pytest.raises(ValueError, match=rf"hidden_size {fields.get('hidden_size', 64)} must "
                                       rf"split into num_heads {fields['num_heads']}"):
    llama.Config(**fields)


@pytest.mark.parametrize("limit", [0, -1.0, float("inf"), float("nan"), True, "7"])
def test_a_swiglu_limit_other_than_a_finite_positive_number_is_refused(limit):
  with pytest.raises(ValueError, match=rf"swiglu_limit must be None \(off\) or a finite "
                                       rf"number > 0, got {limit!r}"):
    llama.Config(swiglu_limit=limit)


def test_an_integer_swiglu_limit_is_kept_as_a_float_and_head_dim_splits_the_width():
  cfg = llama.Config(swiglu_limit=7, hidden_size=96, num_heads=6, num_kv_heads=3)
  assert cfg.swiglu_limit == 7.0 and isinstance(cfg.swiglu_limit, float)
  assert cfg.head_dim == 16


def test_flops_per_token_by_hand():
  cfg = llama.Config(vocab_size=10, hidden_size=4, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=6)
  # q, o: 2 * 4 * 4; k, v: 2 * 4 * 2; MLP: 3 * 4 * 6; head: 4 * 10 -> 160 weights a token
  # multiplies, 6 FLOPs each; attention core: 12 * layers * d * seq = 12 * 1 * 4 * 5
  assert llama.flops_per_token(cfg, 5) == 6 * 160 + 240


def _llama_module(cfg, params):
  module = llama.Llama(cfg, nnx.Rngs(0))
  state = nnx.state(module, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(module, state)
  return module


@pytest.mark.slow
def test_llama_facade_computes_what_the_module_computes_under_its_rules():
  cfg = llama.CONFIGS["tiny"]
  model = registry.get("llama:tiny")
  params = model.init(jax.random.key(0))
  module = _llama_module(cfg, params)
  apply = jax.jit(model.apply, static_argnums=2)
  base, aux = apply(params, TOKENS, model.baseline)
  assert aux == {} and base.dtype == jnp.float32 and base.shape == (2, 16, cfg.vocab_size)
  np.testing.assert_array_equal(base, nnx.jit(lambda m, t: m(t))(module, TOKENS))
  policy = model.policy(r"gemm:fp32_blockwise@layers/0/.*")
  quantized, _ = apply(params, TOKENS, policy)
  qmodule = rules_lib.quantize_model(module, policy.rules)
  np.testing.assert_array_equal(quantized, nnx.jit(lambda m, t: m(t))(qmodule, TOKENS))
  assert not np.array_equal(quantized, base)
  with pytest.raises(ValueError, match="fullmatch"):
    model.policy("gemm:fp32_blockwise@mlp")  # a path no module has


def test_llama_paths_and_flops_from_its_own_shapes():
  model = registry.get("llama:tiny")
  flat = paths_lib.flatten(model.abstract_params())
  got = {p: (model.classifier.module_of(p), model.classifier.layer_of(p)) for p in flat}
  assert got["layers/1/attn/q/kernel"] == ("attn_q", 1)
  assert got["layers/0/mlp/down/kernel"] == ("mlp", 0)
  assert got["layers/0/attn_norm/weight"] == ("norms", 0)
  assert got["head/kernel"] == ("head", None) and got["embed/embedding"] == ("embedding", None)
  # 6 x the kernels every token multiplies + the attention core, counted from the shapes
  cfg, seq = llama.CONFIGS["tiny"], 64
  kernels = sum(int(np.prod(s.shape)) for p, s in flat.items() if p.endswith("kernel"))
  want = 6 * kernels + 12 * cfg.num_layers * cfg.hidden_size * seq
  assert model.flops_per_token(seq) == want
  assert flops.mfu(1000.0, model, seq, 1e12, 2) == pytest.approx(1000.0 * want / 2e12)


@pytest.mark.slow
def test_a_delayed_policy_trains_checkpoints_its_histories_and_the_delayed_grid_compares(
    tmp_path):
  """Training under a delayed-scaled output keeps its histories in the train state and the
  checkpoints; ``compare --policies=delayed`` writes the grid's rows after warm-up passes
  over a window of two batches, where a delayed cell differs from its current-scaled twin
  on a batch whose amax is below the window's."""
  import orbax.checkpoint as ocp

  from fp8jax.study.comparison import sweep
  from fp8jax.train import checkpoint, loop, run_config

  c = run_config.defaults()
  c.model, c.policy = "llama:tiny", "output:e4m3/delayed(h=4)@layers/0/attn"
  c.data.source, c.data.seq_len, c.data.global_batch = "embedded", 32, 4
  c.optim.peak_lr, c.optim.warmup_steps = 3e-3, 1
  c.train.steps, c.train.save_every, c.train.log_every = 2, 2, 2
  work = tmp_path / "train"
  loop.train(c, work)
  assert checkpoint.saved_meta(work / "checkpoints", 2)["delayed_state"] == {
      "layers/0/attn/0/fwd": [4]}
  saved = ocp.PyTreeCheckpointer().restore(work / "checkpoints" / "2" / "state")
  (history,) = jax.tree.leaves(saved["delayed"])
  assert np.all(history[:2] > 0) and not np.any(history[2:])  # two steps pushed

  out = tmp_path / "compare"
  sweep.run(work, out, policies=["delayed"], steps=[2], delayed_warmup=2, floor=False,
            windows=sweep.Windows(offsets=(0,), batches=2, batch_size=4), telemetry=False)
  meta = json.loads((out / "meta.json").read_text())
  assert {n: e.get("delayed_warmup") for n, e in meta["policies"].items()} == {
      n: (2 if n.endswith("_delayed") else None) for n in rules_policy.delayed_grid(
          llama.SITES, 2)}
  rows = {(r["policy"], r["batch"]): r for r in
          map(json.loads, (out / "rows.jsonl").read_text().splitlines())}
  assert len(rows) == 16 and all(r["rel_err"] > 0 for r in rows.values())
  for name in meta["policies"]:
    if name.endswith("_delayed"):
      twin = name.removesuffix("_delayed")
      assert any(rows[(name, b)]["rel_err"] != rows[(twin, b)]["rel_err"] for b in (0, 1))
