"""fp8jax.metrics: parameter paths and the paired gradient comparison.

Expected values come from float64 NumPy loops over a small fake params tree written here
(same path layout as the model: a dense layer 0, MoE layers 1 and 2 with 4 experts).
Routing divergence: ``tests/metrics/test_routing.py``; rankings, rows:
``tests/metrics/test_ranking.py``, ``tests/metrics/test_rows.py``; DeepSeek-MoE's path
classifier: ``tests/models/test_param_paths.py``.
"""

from __future__ import annotations

import functools
import math

from hypothesis import given
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fp8jax import metrics
from fp8jax.models import param_paths

D, V, E, F, H = 3, 5, 4, 2, 4
MOE_LAYERS = (1, 2)
GROUP = {"attn_q": "attention", "attn_k": "attention", "attn_v": "attention",
         "attn_o": "attention", "router": "moe", "routed_experts": "moe",
         "shared_experts": "moe", "dense_mlp": "dense_mlp"}


def _spec():
  """[(keys, shape, module, layer)] of the fake params tree."""
  spec = [(("embed_tokens", "embedding"), (V, D), "embedding", None),
          (("lm_head", "kernel"), (D, V), "head", None),
          (("norm", "weight"), (D,), "norms", None)]
  for i in range(3):
    pre = ("layers", i)
    spec += [(pre + ("input_layernorm", "weight"), (D,), "norms", i),
             (pre + ("post_attention_layernorm", "weight"), (D,), "norms", i)]
    spec += [(pre + ("self_attn", f"{n}_proj", "kernel"), (D, D), f"attn_{n}", i)
             for n in "qkvo"]
    if i in MOE_LAYERS:
      spec += [(pre + ("mlp", "gate"), (D, E), "router", i),
               (pre + ("mlp", "experts_gate"), (E, D, F), "routed_experts", i),
               (pre + ("mlp", "experts_up"), (E, D, F), "routed_experts", i),
               (pre + ("mlp", "experts_down"), (E, F, D), "routed_experts", i)]
      spec += [(pre + ("mlp", "shared_experts", n, "kernel"), s, "shared_experts", i)
               for n, s in (("gate_proj", (D, F)), ("up_proj", (D, F)), ("down_proj", (F, D)))]
    else:
      spec += [(pre + ("mlp", n, "kernel"), s, "dense_mlp", i)
               for n, s in (("gate_proj", (D, H)), ("up_proj", (D, H)), ("down_proj", (H, D)))]
  return spec


SPEC = _spec()
PATH = {keys: "/".join(map(str, keys)) for keys, *_ in SPEC}


def _tree(values):
  """Nested dict from {keys: array}."""
  tree = {}
  for keys, value in values.items():
    node = tree
    for k in keys[:-1]:
      node = node.setdefault(k, {})
    node[keys[-1]] = value
  return tree


def _random_values(rng, scale=1.0):
  return {keys: (rng.standard_normal(shape) * scale).astype(np.float32)
          for keys, shape, *_ in SPEC}


# ----------------------------------------------------------------------------- reference


def _ref_parts(gb, gf, mb=None, mf=None):
  """{keys: [per-slice dict of float64 sums]} (one slice for non-expert leaves)."""
  parts = {}
  for keys, _, module, layer in SPEC:
    b, f = np.asarray(gb[keys], np.float64), np.asarray(gf[keys], np.float64)
    if module == "routed_experts":
      slices = []
      for e in range(E):
        act_b = mb is None or bool(mb[layer][e])
        act_f = mf is None or bool(mf[layer][e])
        be = b[e] if act_b else np.zeros_like(b[e])
        fe = f[e] if act_f else np.zeros_like(f[e])
        both = act_b and act_f
        slices.append({"diff": np.sum((fe - be) ** 2), "bf16": np.sum(be ** 2),
                       "fp8": np.sum(fe ** 2), "dot": np.sum(be * fe),
                       "inter": np.sum((f[e] - b[e]) ** 2) if both else 0.0,
                       "inter_b": np.sum(b[e] ** 2) if both else 0.0,
                       "only_f": np.sum(f[e] ** 2) if act_f and not act_b else 0.0,
                       "only_b": np.sum(b[e] ** 2) if act_b and not act_f else 0.0})
      parts[keys] = slices
    else:
      parts[keys] = [{"diff": np.sum((f - b) ** 2), "bf16": np.sum(b ** 2),
                      "fp8": np.sum(f ** 2), "dot": np.sum(b * f),
                      "inter": np.sum((f - b) ** 2), "inter_b": np.sum(b ** 2),
                      "only_f": 0.0, "only_b": 0.0}]
  return parts


def _add(slices):
  out = {}
  for s in slices:
    for k, v in s.items():
      out[k] = out.get(k, 0.0) + v
  return out


def _ref_stats(s):
  diff, norm_b, norm_f = math.sqrt(s["diff"]), math.sqrt(s["bf16"]), math.sqrt(s["fp8"])
  return {"diff_norm": diff, "diff_norm_intersection": math.sqrt(s["inter"]),
          "norm_bf16": norm_b, "norm_fp8": norm_f, "rel_err": diff / norm_b,
          "rel_err_intersection": math.sqrt(s["inter"]) / math.sqrt(s["inter_b"]),
          "cosine": s["dot"] / (norm_b * norm_f)}


def _ref_groups(parts):
  """Reference aggregates keyed like the compare result."""
  groups = {"by_module": {}, "by_group": {}, "by_layer": {}, "by_module_layer": {}}
  for keys, _, module, layer in SPEC:
    cells = {"by_module": module, "by_group": GROUP.get(module, "other"),
             "by_layer": "none" if layer is None else str(layer)}
    if layer is not None:
      cells["by_module_layer"] = f"{module}/{layer}"
    for grouping, key in cells.items():
      groups[grouping].setdefault(key, []).extend(parts[keys])
  out = {g: {k: _ref_stats(_add(v)) for k, v in d.items()} for g, d in groups.items()}
  out["global"] = _ref_stats(_add([s for slices in parts.values() for s in slices]))
  out["per_param"] = {PATH[k]: _ref_stats(_add(v)) for k, v in parts.items()}
  return out


def _assert_stats(got, want, keys=("diff_norm", "diff_norm_intersection", "norm_bf16",
                                   "norm_fp8", "rel_err", "cosine")):
  for k in keys:
    np.testing.assert_allclose(float(got[k]), want[k], rtol=2e-5, atol=1e-30, err_msg=k)


DS = param_paths.DEEPSEEK
_COMPARE = jax.jit(functools.partial(metrics.compare_grads, classifier=DS),
                   static_argnames="direct")


def _masks(bits):
  """{1: bool [E], 2: bool [E]} from 2E booleans."""
  bits = np.asarray(bits, bool)
  return {1: bits[:E], 2: bits[E:2 * E]}


# --------------------------------------------------------------------------------- paths


def test_direct_predicates_from_module_layer_pairs_and_path_prefixes():
  by_pair = metrics.as_predicate({("attn_o", None), ("routed_experts", 2)}, DS)
  assert by_pair("layers/7/self_attn/o_proj/kernel")
  assert by_pair("layers/2/mlp/experts_down") and not by_pair("layers/1/mlp/experts_down")
  by_prefix = metrics.as_predicate(("layers/1/mlp",), DS)
  assert by_prefix("layers/1/mlp/gate") and not by_prefix("layers/1/mlp_x/gate")
  assert not by_prefix("layers/11/mlp/gate")


# ------------------------------------------------------------------- gradient comparison


def _hand_case():
  """Zero gradients except attn_o of layer 0 and experts_gate of layer 1."""
  gb = {keys: np.zeros(shape, np.float32) for keys, shape, *_ in SPEC}
  gf = {keys: np.zeros(shape, np.float32) for keys, shape, *_ in SPEC}
  o_proj = ("layers", 0, "self_attn", "o_proj", "kernel")
  gf[o_proj][:] = 0.5                                    # 9 elements: diff² = 2.25
  experts = ("layers", 1, "mlp", "experts_gate")         # 6 elements per expert
  gb[experts][:] = np.array([1.0, 2.0, 5.0, 0.0])[:, None, None]
  gf[experts][:] = np.array([1.0, 7.0, 3.0, 2.0])[:, None, None]
  mask_b = {1: np.array([1, 1, 0, 1], bool), 2: np.ones(E, bool)}
  mask_f = {1: np.array([1, 0, 1, 1], bool), 2: np.ones(E, bool)}
  return _tree(gb), _tree(gf), mask_b, mask_f


@pytest.mark.slow
def test_union_and_intersection_exact_numbers():
  gb, gf, mask_b, mask_f = _hand_case()
  res = _COMPARE(gb, gf, mask_b, mask_f, direct=frozenset({("attn_o", None)}))
  # Experts of layer 1: 0 both active, equal; 1 only bf16 (2 vs zero-filled 7); 2 only fp8
  # (zero-filled 5 vs 3); 3 both active (0 vs 2). Six elements per expert.
  union_sq = 0 + 6 * 2**2 + 6 * 3**2 + 6 * 2**2 + 2.25    # 104.25
  inter_sq = 6 * 2**2 + 2.25                              # 26.25
  g = res["global"]
  np.testing.assert_allclose(g["diff_norm"], math.sqrt(union_sq), rtol=1e-6)
  np.testing.assert_allclose(g["diff_norm_intersection"], math.sqrt(inter_sq), rtol=1e-6)
  np.testing.assert_allclose(g["norm_bf16"], math.sqrt(6 * 1 + 6 * 4), rtol=1e-6)
  np.testing.assert_allclose(g["norm_fp8"], math.sqrt(6 + 6 * 9 + 6 * 4 + 2.25), rtol=1e-6)
  np.testing.assert_allclose(g["cosine"], 6 / math.sqrt(30 * 86.25), rtol=1e-6)
  np.testing.assert_allclose(g["rel_err"], math.sqrt(union_sq / 30), rtol=1e-6)
  np.testing.assert_allclose(g["rel_err_intersection"], math.sqrt(inter_sq / 6), rtol=1e-6)
  per_expert = res["per_expert"]["layers/1/mlp/experts_gate"]["diff_norm"]
  np.testing.assert_allclose(per_expert, np.sqrt([0, 24, 54, 24]), rtol=1e-6)
  np.testing.assert_allclose(res["by_expert"]["1"]["diff_norm"], np.sqrt([0, 24, 54, 24]),
                             rtol=1e-6)
  np.testing.assert_array_equal(res["by_expert"]["2"]["diff_norm"], np.zeros(E))
  direct = res["direct"]
  np.testing.assert_allclose(direct["diff_norm_direct"], 1.5, rtol=1e-6)
  np.testing.assert_allclose(direct["share_direct"], 2.25 / union_sq, rtol=1e-6)
  np.testing.assert_allclose(direct["share_direct_intersection"], 2.25 / inter_sq, rtol=1e-6)
  # Without masks every expert counts: 0 + 25*6 + 4*6 + 4*6 + 2.25.
  np.testing.assert_allclose(_COMPARE(gb, gf, direct=None)["global"]["diff_norm"],
                             math.sqrt(150 + 24 + 24 + 2.25), rtol=1e-6)


@pytest.mark.slow
def test_routing_dicts_work_as_masks():
  gb, gf, mask_b, mask_f = _hand_case()
  as_routing = lambda m: {k: {"expert_counts": v.astype(np.int32) * 3} for k, v in m.items()}
  got = metrics.compare_grads(gb, gf, as_routing(mask_b), as_routing(mask_f), classifier=DS)
  want = _COMPARE(gb, gf, mask_b, mask_f)
  np.testing.assert_array_equal(got["global"]["diff_norm"], want["global"]["diff_norm"])
  masks = metrics.expert_masks(as_routing(mask_b))
  np.testing.assert_array_equal(masks[1], mask_b[1])


def test_matches_float64_reference_and_aggregates_compose():
  rng = np.random.default_rng(0)
  vb = _random_values(rng)
  vf = {k: v + 0.1 * rng.standard_normal(v.shape).astype(np.float32) for k, v in vb.items()}
  mask_b, mask_f = _masks([1, 0, 1, 1, 0, 1, 1, 1]), _masks([1, 1, 0, 1, 0, 1, 1, 0])
  res = _COMPARE(_tree(vb), _tree(vf), mask_b, mask_f)
  ref = _ref_groups(_ref_parts(vb, vf, mask_b, mask_f))
  _assert_stats(res["global"], ref["global"])
  for grouping in ("by_module", "by_group", "by_layer", "by_module_layer", "per_param"):
    assert set(res[grouping]) == set(ref[grouping]), grouping
    for key, want in ref[grouping].items():
      _assert_stats(res[grouping][key], want, keys=("diff_norm", "norm_bf16", "norm_fp8"))
  # Squares compose to the global squares, for every grouping.
  total = float(res["global"]["diff_norm"]) ** 2
  for grouping in ("by_module", "by_group", "by_layer", "per_param"):
    parts = sum(float(v["diff_norm"]) ** 2 for v in res[grouping].values())
    np.testing.assert_allclose(parts, total, rtol=1e-5, err_msg=grouping)
  cells = sum(float(v["diff_norm"]) ** 2 for v in res["by_module_layer"].values())
  np.testing.assert_allclose(cells + float(res["by_layer"]["none"]["diff_norm"]) ** 2, total,
                             rtol=1e-5)
  experts = sum(float(np.sum(np.square(v["diff_norm"]))) for v in res["by_expert"].values())
  np.testing.assert_allclose(experts, float(res["by_module"]["routed_experts"]["diff_norm"])
                             ** 2, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_identical_gradients_give_zero_difference_and_cosine_one(dtype):
  rng = np.random.default_rng(1)
  values = {k: v.astype(dtype) for k, v in _random_values(rng).items()}
  copy = {k: v.copy() for k, v in values.items()}
  masks = _masks([1, 0, 1, 1, 1, 1, 0, 1])
  res = metrics.compare_grads(_tree(values), _tree(copy), masks, masks,
                              loss_bf16=2.5, loss_fp8=2.5, classifier=DS)
  for group in [res["global"], *res["per_param"].values(), *res["by_module"].values()]:
    assert float(group["diff_norm"]) == 0.0 and float(group["diff_norm_intersection"]) == 0.0
    assert float(group["rel_err"]) == 0.0
    assert float(group["cosine"]) == 1.0
  assert float(res["loss"]["loss_abs_err"]) == 0.0 and float(res["loss"]["loss_rel_err"]) == 0


def test_loss_errors():
  out = metrics.loss_errors(jnp.float32(2.0), jnp.float32(2.5))
  assert float(out["loss_abs_err"]) == 0.5 and float(out["loss_rel_err"]) == 0.25


def test_bad_inputs_raise():
  """Refused as it traces (abstractly here: nothing compiles)."""
  gb, gf, mask_b, _ = _hand_case()
  compare = functools.partial(jax.eval_shape, functools.partial(metrics.compare_grads,
                                                                classifier=DS))
  with pytest.raises(ValueError, match="structure"):
    compare(gb, {"lm_head": gf["lm_head"]})
  with pytest.raises(ValueError, match="no entry for layer 2"):
    compare(gb, gf, {1: mask_b[1]})
  with pytest.raises(ValueError, match="both losses"):
    compare(gb, gf, loss_bf16=1.0)


@given(seed=st.integers(0, 2**32 - 1), bits=st.lists(st.booleans(), min_size=4 * E,
                                                      max_size=4 * E),
       scale=st.sampled_from([1e-3, 1.0, 30.0]), close=st.booleans())
def test_union_decomposes_into_intersection_and_one_sided_parts(seed, bits, scale, close):
  rng = np.random.default_rng(seed)
  vb = _random_values(rng, scale)
  vf = ({k: v * np.float32(1 + 1e-3) for k, v in vb.items()} if close
        else _random_values(rng, scale))
  mask_b, mask_f = _masks(bits[:2 * E]), _masks(bits[2 * E:])
  res = _COMPARE(_tree(vb), _tree(vf), mask_b, mask_f)
  parts = _ref_parts(vb, vf, mask_b, mask_f)
  ref = _add([s for slices in parts.values() for s in slices])
  union, inter = float(res["global"]["diff_norm"]), float(res["global"]["diff_norm_intersection"])
  np.testing.assert_allclose(union**2, ref["diff"], rtol=1e-5)
  np.testing.assert_allclose(inter**2, ref["inter"], rtol=1e-5)
  np.testing.assert_allclose(union**2, inter**2 + ref["only_f"] + ref["only_b"], rtol=1e-5)
  assert union >= inter * (1 - 1e-6)
  for keys, _, module, _ in SPEC:
    if module == "routed_experts":
      want = [math.sqrt(s["diff"]) for s in parts[keys]]
      np.testing.assert_allclose(res["per_expert"][PATH[keys]]["diff_norm"], want,
                                 rtol=2e-5, atol=1e-30)


@pytest.mark.slow
def test_runs_under_jit_and_matches_eager():
  rng = np.random.default_rng(2)
  vb = _random_values(rng)
  gb, gf = _tree(vb), _tree(_random_values(rng))
  mask_b, mask_f = _masks([1] * 8), _masks([0, 1] * 4)
  jitted = _COMPARE(gb, gf, mask_b, mask_f)
  eager = metrics.compare_grads(gb, gf, mask_b, mask_f, classifier=DS)
  assert jax.tree.structure(jitted) == jax.tree.structure(eager)
  for a, b in zip(jax.tree.leaves(jitted), jax.tree.leaves(eager)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert len(jax.tree.leaves(jitted)) < 80  # one array per metric and grouping
  assert isinstance(jitted["per_param"], metrics.Table)
  assert jitted["by_module"].column("diff_norm")["attn_o"] == jitted["by_module"]["attn_o"][
      "diff_norm"]
  weights = jax.jit(lambda p: metrics.weight_norms(p, DS))(gb)
  ref = {m: math.sqrt(sum(np.sum(np.float64(vb[k]) ** 2) for k, _, mod, _ in SPEC if mod == m))
         for m in ("router", "norms")}
  for module, want in ref.items():
    np.testing.assert_allclose(weights["by_module"][module]["weight_norm"], want, rtol=1e-5)
  np.testing.assert_allclose(
      np.sum(np.square(weights["by_expert"]["1"]["weight_norm"])),
      float(weights["by_module_layer"]["routed_experts/1"]["weight_norm"]) ** 2, rtol=1e-5)

