"""``apply(..., scan_layers=True)``: runs of alike layers as one scan, with the same logits,
aux outputs, telemetry and gradients (params and delayed-scaling histories) as the loop.

XLA may keep a BF16 intermediate in float32 where that is faster (its default
``--xla_allow_excess_precision=true``), and where it does depends on what it fuses, so a
scanned layer and an unrolled one can differ in the last bits of BF16 values. The exact
comparison runs in a process with ``--xla_allow_excess_precision=false``.
"""

import json
import os
import pathlib
import subprocess
import sys

from flax import nnx
import jax
import pytest

from fp8jax.models import config as config_lib
from fp8jax.models import deepseek_moe, layer_scan, policy_rules
from fp8jax.models import policy as policy_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
CFG = config_lib.tiny(num_hidden_layers=5)  # layer 0 dense, 1-4 MoE

# (policy, moe_impl, expected runs)
CASES = [
    ("bf16", "dispatch", [[0], [1, 2, 3, 4]]),
    ("attn@0:e4m3+moe@1-2:e5m2", "dispatch", [[0], [1, 2], [3, 4]]),
    ("gemm:fp32_blockwise@1-2", "dispatch", [[0], [1, 2], [3, 4]]),
    ("gemm:nvfp4_recipe", "dispatch", [[0], [1, 2, 3], [4]]),  # the last layer in BF16
    ("moe_l1-4_e4m3_delayed", "dispatch", [[0], [1, 2, 3, 4]]),
    ("attn@1-2:e4m3", "reference", [[0], [1, 2], [3, 4]]),
]


def _runs(expr):
  policy = policy_lib.parse_policy(expr)
  decide = policy_rules.decisions(policy, CFG.num_hidden_layers)
  abstract = nnx.eval_shape(lambda: deepseek_moe.DeepseekMoE(CFG, nnx.Rngs(0)))
  return layer_scan.runs([layer_scan.signature(layer, layer.index, layer.is_moe, decide)
                          for layer in abstract.layers])


@pytest.mark.parametrize("expr, impl, want", CASES)
def test_runs_group_alike_layers(expr, impl, want):
  del impl
  assert _runs(expr) == want


def test_runs():
  assert layer_scan.runs(list("aabccc")) == [[0, 1], [2], [3, 4, 5]]
  assert layer_scan.runs([]) == []


def test_scan_traces_one_layer_per_run():
  params = deepseek_moe.abstract_params(CFG)
  tokens = jax.ShapeDtypeStruct((2, 8), "int32")
  for scan, want in ((False, 0), (True, 2)):
    jaxpr = jax.make_jaxpr(lambda p, t, scan=scan: deepseek_moe.apply(
        p, t, CFG, policy_lib.parse_policy("attn@0:e4m3+moe@1-2:e5m2"),
        scan_layers=scan))(params, tokens)
    assert sum(e.primitive.name == "scan" for e in jaxpr.jaxpr.eqns) == want


# Computes each case unrolled (params per layer) and scanned (params stored stacked as the
# BF16 runs, [[0], [1, 2, 3, 4]]: a policy of other runs slices them); prints one JSON
# line per case.
_COMPARE = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from fp8jax.models import config as config_lib, deepseek_moe, delayed_sites, layer_scan
from fp8jax.models import layer_stack, policy as policy_lib
cfg = config_lib.tiny(num_hidden_layers=5)
params = deepseek_moe.init(cfg, jax.random.key(0))
stacked = layer_stack.stack(params, deepseek_moe.layer_runs(cfg, policy_lib.BF16))
tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
for expr, impl, unroll in json.loads(sys.argv[1]):
  policy = policy_lib.parse_policy(expr)
  state = jax.tree.map(lambda h: h + 0.25, delayed_sites.init(cfg, policy))
  def loss(p, st, scan):
    logits, aux = deepseek_moe.apply(p, tokens, cfg, policy, moe_impl=impl, delayed_state=st,
                                     telemetry=True, gemm_telemetry=True, scan_layers=scan)
    return deepseek_moe.lm_loss(logits, tokens) + aux["aux_loss"], (logits, aux)
  f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
  a = jax.device_get(f(params, state, False))
  b = jax.device_get(layer_stack.unstack(f(stacked, state, layer_scan.ScanOptions(unroll))))
  flat = jax.tree_util.tree_flatten_with_path(a)[0]
  differ = [jax.tree_util.keystr(k) for (k, x), y in zip(flat, jax.tree.leaves(b))
            if not np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)]
  print(json.dumps({"expr": expr, "same_tree": jax.tree.structure(a) == jax.tree.structure(b),
                    "leaves": len(flat), "differ": differ}), flush=True)
"""


@pytest.mark.slow
def test_stacked_scan_is_bit_identical_to_the_loop():
  """Sites (the site grid's kind of policy) and delayed scaling; params per layer and
  scanned as stored stacked give the same bits (tests/models/test_layer_stack.py: the same from
  params scanned per layer), the scan unrolled (the default) or rolled. A GEMM recipe:
  tests/models/test_scan_wiring.py, a scanned run's losses against the loop's."""
  keep = {"attn@0:e4m3+moe@1-2:e5m2": 0, "moe_l1-4_e4m3_delayed": 1}
  cases = [(e, i, keep[e]) for e, i, _ in CASES if e in keep]
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_allow_excess_precision=false"}
  out = subprocess.run([sys.executable, "-c", _COMPARE, json.dumps(cases)], env=env,
                       capture_output=True, text=True, timeout=900, cwd=REPO)
  assert out.returncode == 0, out.stderr[-3000:]
  rows = [json.loads(line) for line in out.stdout.splitlines()]
  assert [r["expr"] for r in rows] == [e for e, _, _ in cases]
  for r in rows:
    assert r["same_tree"] and r["leaves"] > 80 and r["differ"] == [], r


def test_scan_options_refuse_what_they_cannot_do():
  with pytest.raises(ValueError, match="layers per iteration"):
    layer_scan.ScanOptions(unroll=-1)
  with pytest.raises(ValueError, match="no policy of jax.checkpoint_policies.*dots_saveable"):
    layer_scan.ScanOptions(remat="dots")
  assert layer_scan.options(True) == layer_scan.ScanOptions()
  assert layer_scan.options(False) is None


@pytest.mark.parametrize("opts, unroll, remat", [
    (True, True, False), (layer_scan.ScanOptions(unroll=1), 1, False),
    (layer_scan.ScanOptions(unroll=2, remat="nothing_saveable"), 2, True)])
def test_scan_options_reach_the_scan(opts, unroll, remat):
  """The run is one scan with the options' unrolling, its layer under ``jax.checkpoint``
  when they name a policy."""
  params = deepseek_moe.abstract_params(CFG)
  tokens = jax.ShapeDtypeStruct((2, 8), "int32")
  jaxpr = jax.make_jaxpr(lambda p, t: deepseek_moe.apply(p, t, CFG, scan_layers=opts))(
      params, tokens)
  (scan,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
  want = scan.params["length"] if unroll is True else unroll
  assert scan.params["unroll"] == want
  inner = scan.params["jaxpr"].jaxpr.eqns
  assert any(e.primitive.name.startswith(("checkpoint", "remat")) for e in inner) == remat
