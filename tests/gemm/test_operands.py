"""The six operand copies of a GEMM config (fp8jax/gemm/operands.py, RoleSpecs' copy specs,
``GemmConfig.from_forward``) against a float64 NumPy reference of the three GEMMs
(tests/references/reference_copies.py) on operands quantized by the NumPy quantizer
(tests/references/reference_mx.py), dense and grouped; the preset mxfp8_fwd_nvfp4_bwd
(Transformer Engine's mxfp8_fwd_nvfp4_bwd_factory); the refused combinations; and the
roads to a copy's spec (Rules, the policy text, the policy record)."""

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.gemm import grouped, recipes
from fp8jax.models import policy as policy_lib
from fp8jax.models import policy_expression, rules_policy
from fp8jax.quant import rounding_bits
from fp8jax.rules import rule as rule_lib
from tests import strategies as hs
from tests.references import reference_copies as ref
from tests.references import reference_mx

DN = (((1,), (0,)), ((), ()))  # x [M, K] . w [K, N]


def _p(name):
  return fp8jax.preset(name).replace(backward=None)


ROWS = {"mxfp8": _p("mxfp8"), "mxfp8_e5m2": _p("mxfp8_e5m2"), "mxfp4": _p("mxfp4"),
        "nvfp4": _p("nvfp4"), "e4m3_tensor": fp8jax.QuantSpec(),
        "e4m3_1x128": fp8jax.QuantSpec(granularity=fp8jax.tile(128))}
"""Specs for copies of X and dY: 1 x t tiles along the contraction, or one per tensor."""
WEIGHTS = {**ROWS, "nvfp4_16x16": _p("nvfp4_weight"),
           "e4m3_128x128": fp8jax.QuantSpec(granularity=fp8jax.block((128, 128))),
           "mxfp8_32x32": _p("mxfp8").replace(granularity=fp8jax.block((32, 32)))}
COPIES = {"fprop_input": ROWS, "fprop_weight": WEIGHTS, "dgrad_grad": ROWS,
          "dgrad_weight": WEIGHTS, "wgrad_input": ROWS, "wgrad_grad": ROWS}


def _config(names, from_forward=(), transpose="requant"):
  s = {copy: COPIES[copy][name] for copy, name in names.items()}
  roles = fp8jax.RoleSpecs(input=s["fprop_input"], weight=s["fprop_weight"],
                           grad=s["dgrad_grad"], dgrad_weight=s["dgrad_weight"],
                           wgrad_input=s["wgrad_input"], wgrad_grad=s["wgrad_grad"])
  return fp8jax.GemmConfig(roles=roles, from_forward=from_forward, transpose=transpose,
                           impl="xla")


def _quant(names):
  """The NumPy quantizer of each copy: its dequantized values, float32."""
  def quant(copy, a):
    spec = COPIES[copy][names[copy]]
    return np.asarray(reference_mx.ref_for_spec(np.asarray(a, np.float32), spec).deq,
                      np.float32)
  return quant


def _token_tile(spec) -> int:
  """Rows per scale along the tokens of a Wgrad copy [C, tokens] (1: one per tensor)."""
  return spec.granularity.sizes[0] if spec.granularity.kind == "tile" else 1


def _assert_near(got, want, bound, what):
  """Equal to float32 accumulation: within 1e-5 of the sum of |products| per output."""
  got, want = np.asarray(got, np.float64), np.asarray(want)
  bad = np.abs(got - want) > 1e-5 * bound + 1e-30
  assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} outputs differ, e.g. got "
                         f"{got[bad][:3]}, want {want[bad][:3]}")


@st.composite
def layers(draw):
  names = {copy: draw(st.sampled_from(sorted(pool))) for copy, pool in COPIES.items()}
  ff = tuple(r for r in ("input", "weight") if draw(st.booleans()))
  m, k, n = (draw(st.sampled_from(v)) for v in ((24, 64), (32, 64), (16, 48)))
  seed = draw(st.integers(0, 2**31 - 1))
  return names, ff, draw(st.sampled_from(["requant", "double"])), (m, k, n), seed


def _data(shapes, seed):
  """float32 arrays with rows and columns of several magnitudes."""
  rng = np.random.default_rng(seed)
  return [(rng.standard_normal(s) * np.exp(rng.uniform(-2, 2, (s[0], 1)))
           * np.exp(rng.uniform(-1, 1, (1, s[-1])))).astype(np.float32) for s in shapes]


def _dense(cfg, x, w, dy):
  y, vjp = jax.vjp(lambda a, b: fp8jax.fp8_dot_general(a, b, DN, config=cfg), x, w)
  return (y, *vjp(jnp.asarray(dy)))


@settings(max_examples=hs.examples(2, 12), deadline=None)
@given(layer=layers())
def test_dense_copies_match_the_float64_reference(layer):
  """Y, dX and dW from six independently chosen copy specs, X^T and W^T from the originals
  or from Fprop's quantized values (``from_forward``; all three with ``double``)."""
  names, ff, policy, (m, k, n), seed = layer
  x, w, dy = _data([(m, k), (k, n), (m, n)], seed)
  got = jax.jit(_dense, static_argnums=0)(_config(names, ff, policy), x, w, dy)
  want = ref.dense_layer(x, w, dy, _quant(names), ff, policy == "double")
  a = lambda v: np.abs(v).astype(np.float64)  # noqa: E731
  bounds = (a(x) @ a(w), a(dy) @ a(w).T, a(x).T @ a(dy))  # 4-bit operands stay below 2x
  for g, wv, b, what in zip(got, want, bounds, ("Y", "dX", "dW")):
    _assert_near(g, wv, 2 * b, what)


@pytest.mark.slow
@settings(max_examples=hs.examples(2, 10), deadline=None)
@given(layer=layers(), cut=st.tuples(st.floats(0, 1), st.floats(0, 1)))
def test_grouped_copies_match_the_float64_reference(layer, cut):
  """The grouped GEMM (three experts, one possibly empty): each expert's weight a tensor
  of its own, X and dY one tensor each, Wgrad's groups padded to whole token tiles."""
  names, ff, policy, (m, k, n), seed = layer
  a, b = sorted(int(c * m) for c in cut)
  sizes = [a, b - a, m - b]
  x, dy = _data([(m, k), (m, n)], seed)
  w = np.stack(_data([(k, n)] * 3, seed + 1))
  cfg = _config(names, ff, policy)

  def run(x, w, dy):
    fn = lambda a, b: grouped.fp8_ragged_dot(a, b, jnp.asarray(sizes, jnp.int32), cfg)  # noqa: E731
    y, vjp = jax.vjp(fn, x, w)
    return (y, *vjp(dy))
  got = jax.jit(run)(x, w, dy)
  multiple = math.lcm(_token_tile(COPIES["wgrad_input"][names["wgrad_input"]]),
                      _token_tile(COPIES["wgrad_grad"][names["wgrad_grad"]]))
  want = ref.grouped_layer(x, w, dy, sizes, _quant(names), multiple, ff, policy == "double")
  ab = lambda v: np.abs(v).astype(np.float64)  # noqa: E731
  rows = np.repeat(np.arange(3), sizes)
  bounds = (np.einsum("nk,nkf->nf", ab(x), ab(w)[rows]),
            np.einsum("nf,nkf->nk", ab(dy), ab(w)[rows]),
            np.stack([ab(x)[rows == e].T @ ab(dy)[rows == e] for e in range(3)]))
  for g, wv, bd, what in zip(got, want, bounds, ("Y", "dX", "dW")):
    _assert_near(g, wv, 2 * bd, what)


@pytest.mark.slow  # 12-13 s on 2 busy cores: in CI's slow tier
def test_each_copy_reaches_its_gemm():
  """One copy's spec changed at a time changes only the GEMM that reads it; with every copy
  set to its role's spec (and the sources the originals) the bits are the recipe's."""
  x, w, dy = _data([(32, 64), (64, 48), (32, 48)], 0)
  base = recipes.recipe("mxfp8")
  want = jax.jit(_dense, static_argnums=0)(base, x, w, dy)
  r = base.roles
  same = base.replace(roles=dataclasses.replace(r, dgrad_weight=r.weight, wgrad_input=r.input,
                                                wgrad_grad=r.grad))
  for a, b in zip(jax.jit(_dense, static_argnums=0)(same, x, w, dy), want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  nv = _p("nvfp4")
  for field, changed in (("dgrad_weight", 1), ("wgrad_input", 2), ("wgrad_grad", 2)):
    cfg = base.replace(roles=dataclasses.replace(r, **{field: nv}))
    got = jax.jit(_dense, static_argnums=0)(cfg, x, w, dy)
    differs = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want)]
    assert differs == [i == changed for i in range(3)], field


@pytest.mark.slow  # 12-13 s on 2 busy cores: in CI's slow tier
def test_mxfp8_fwd_nvfp4_bwd_dgrad_reads_w_t_from_the_mxfp8_weight():
  """Transformer Engine's mxfp8_fwd_nvfp4_bwd_factory, Dgrad: the NVFP4 recipe's dY (8-bit
  stochastic rounding) times a plain NVFP4 1x16 W^T quantized from the values of the MXFP8
  W that Fprop read (the float64 reference), not from W itself."""
  x, w, dy = _data([(48, 64), (64, 32), (48, 32)], 1)
  cfg = recipes.recipe("mxfp8_fwd_nvfp4_bwd")
  dx = jax.jit(_dense, static_argnums=0)(cfg, x, w, dy)[1]
  grad = cfg.roles.grad  # dY as Dgrad quantizes it: 8-bit stochastic rounding, stream 4
  dy3 = jnp.asarray(dy)[None]
  dyq = np.asarray(fp8jax.dequantize(fp8jax.quantize(
      dy3, grad, key=rounding_bits.content_key(dy3, 4)), jnp.float32))[0].astype(np.float64)
  q = lambda a, spec: np.asarray(reference_mx.ref_for_spec(a, spec).deq, np.float64)  # noqa: E731
  w_fwd = q(w.T, _p("mxfp8"))  # [N, K], as Fprop quantized it
  want = dyq @ q(w_fwd.T.astype(np.float32), _p("nvfp4")).T
  bound = np.abs(dyq) @ np.abs(w_fwd)
  _assert_near(dx, want, 2 * bound, "dX")
  from_w = dyq @ q(w, _p("nvfp4")).T  # W^T from the original W: not the factory's
  assert (np.abs(from_w - want) > 1e-5 * bound).any()
  assert cfg.describe().endswith("copies=dgrad_weight,wgrad_input from-forward=weight")


@pytest.mark.slow
def test_mxfp8_fwd_nvfp4_bwd_fprop_and_wgrad_are_mxfp8s_and_nvfp4_recipes():
  """Its Fprop is the MXFP8 recipe's and its Wgrad the NVFP4 recipe's (NVFP4 X^T from the
  original X, stochastically rounded dY^T, both behind TE's RHT), bit for bit, in the
  dense and the grouped GEMM (an empty expert; groups padded to 16 rows)."""
  x, w, dy = _data([(48, 64), (64, 32), (48, 32)], 2)
  we = np.stack(_data([(64, 32)] * 3, 3))
  sizes = jnp.asarray([20, 0, 28], jnp.int32)

  def both(cfg):
    dense = _dense(cfg, x, w, dy)
    y, vjp = jax.vjp(lambda a, b: grouped.fp8_ragged_dot(a, b, sizes, cfg), x, we)
    return dense, (y, *vjp(jnp.asarray(dy)))
  run = jax.jit(both, static_argnums=0)
  got = run(recipes.recipe("mxfp8_fwd_nvfp4_bwd"))
  fwd, bwd = run(recipes.recipe("mxfp8")), run(recipes.recipe("nvfp4_recipe"))
  for i in range(2):  # dense, grouped
    np.testing.assert_array_equal(np.asarray(got[i][0]), np.asarray(fwd[i][0]))
    np.testing.assert_array_equal(np.asarray(got[i][2]), np.asarray(bwd[i][2]))
    assert not np.array_equal(np.asarray(got[i][1]), np.asarray(bwd[i][1]))  # W^T differs


@pytest.mark.parametrize("base, change, match", [
    ("mxfp8", dict(from_forward=("grad",)), "from_forward takes a tuple of distinct roles"),
    ("mxfp8", dict(from_forward=["weight"]), "from_forward takes a tuple"),
    ("mxfp8", dict(from_forward=("weight",), fprop="bf16"), "needs fprop and dgrad in FP8"),
    ("nvfp4_recipe", dict(from_forward=("input",), wgrad_hadamard=0,
                          roles=recipes.recipe("nvfp4").roles.replace_all(rounding="stochastic")),
     "rounds to nearest"),
    ("ufp4", dict(from_forward=("weight",)), "rht_gemms='all'"),
    ("mxfp8", dict(transpose="scaling_aware", roles=dataclasses.replace(
        recipes.recipe("mxfp8").roles, wgrad_grad=_p("mxfp8_e5m2"))), "dY\\^T needs dY's format"),
    ("nvfp4_quartet2", dict(roles=dataclasses.replace(recipes.recipe("nvfp4_quartet2").roles,
                                                      dgrad_weight=_p("nvfp4"))),
     "backward_from_forward already"),
])
def test_bad_combinations_are_refused_in_one_line(base, change, match):
  with pytest.raises(ValueError, match=match) as e:
    recipes.recipe(base).replace(**change)
  assert "\n" not in str(e.value)


def test_rules_and_policy_text_reach_a_copy():
  """A copy's spec by a Rule role, by the policy text (``ROLE:SPEC@REGEX``, ``none``: the
  role's spec again), in the policy record only when set, and the preset by name."""
  plan = rule_lib.resolve(rules_policy.parse("gemm:mxfp8+dgrad_weight:nvfp4").rules,
                          "fc1", ("dot_general",))
  assert plan.config("dot_general").roles.operand("dgrad", "weight") == fp8jax.preset("nvfp4")
  back = rules_policy.parse("gemm:mxfp8+dgrad_weight:nvfp4+dgrad_weight:none").rules
  assert rule_lib.resolve(back, "fc1", ("dot_general",)).config(
      "dot_general") == recipes.recipe("mxfp8")
  with pytest.raises(ValueError, match=r"rule '\.\*', role wgrad_grad.*scaling_aware"):
    rule_lib.resolve(rules_lib.Rules([
        rules_lib.Rule(".*", recipes.recipe("mxfp8").replace(transpose="scaling_aware")),
        rules_lib.Rule(".*", _p("mxfp8_e5m2"), role="wgrad_grad")]), "fc1", ("dot_general",))
  pol = policy_lib.parse_policy("gemm:mxfp8_fwd_nvfp4_bwd")
  assert policy_expression.to_expression(pol) == "gemm:mxfp8_fwd_nvfp4_bwd"
  rec = policy_lib.record(pol)["gemm"]
  assert rec["from_forward"] == ["weight"] and rec["roles"]["dgrad_weight"]["format"] == "e2m1"
  assert "wgrad_grad" not in rec["roles"]
  plain = policy_lib.record(policy_lib.parse_policy("gemm:mxfp8"))["gemm"]
  assert "from_forward" not in plain and "dgrad_weight" not in plain["roles"]
  noise = policy_lib.noise_policy(pol)
  assert all(s.noise_control for s in noise.gemm.roles.specs())
  assert policy_lib.is_noise_control(noise)
