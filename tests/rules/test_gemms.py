"""`quantize_gemms` (fp8jax.rules.gemms): parameter paths of a traced function, what the
rules decide on each GEMM site, and the errors naming a rule that quantizes nothing."""

import jax
import jax.numpy as jnp
from jax.tree_util import DictKey, GetAttrKey, SequenceKey
import numpy as np
import pytest

import fp8jax
from fp8jax import rules as rules_lib
from fp8jax.rules import Rule, Rules, gemms
from fp8jax.rules.jaxpr_route import Action, Site
from tests.rules.conftest import TENSOR, TOKENS, TiedLM, as_fn, fresh

SDS = jax.ShapeDtypeStruct


def test_path_of_joins_the_keys_and_drops_a_variables_value():
  assert gemms.path_of((DictKey("head"), GetAttrKey("kernel"), GetAttrKey("value"))) == (
      "head/kernel")
  assert gemms.path_of((SequenceKey(0), DictKey("w"))) == "0/w"
  assert gemms.path_of((DictKey("value"),)) == "value"  # a dict key named value stays
  assert gemms.path_of(()) == ""


def test_trace_gives_paths_to_the_parameter_arguments_only_and_closes_over_the_rest():
  fn = lambda p, x, c, n: (p["k"] @ x) * c + n  # noqa: E731
  args = ({"k": jnp.ones((2, 2)), "name": "text"}, jnp.ones((2, 2)), jnp.ones(()), 3)
  jaxpr, values, paths, out_tree = gemms.trace(fn, args, {}, (0, 2))
  assert paths == ["k", None, "2"]  # a parameter argument that is one array: its index
  assert [np.shape(v) for v in values] == [(2, 2), (2, 2), ()]
  assert len(jaxpr.jaxpr.invars) == 3 and out_tree == jax.tree.structure(0)


def _site(weight_param=None, lhs_param=None, **kw):
  return Site("dot_general", (2, 4), (4, 3), lhs_param, weight_param, **kw)


@pytest.mark.parametrize("rules, site, want", [
    ([Rule("fc", TENSOR)], _site(), Action(note="no parameter operand")),
    ([Rule("fc", TENSOR)], _site("fc/kernel"), Action(TENSOR, (0,))),
    ([Rule("fc/kernel", TENSOR)], _site("fc/kernel"), Action(TENSOR, (0,))),  # full path
    ([Rule("emb", TENSOR)], _site(lhs_param="emb"), Action(TENSOR, (0,))),  # weight on the lhs
    ([Rule("other", TENSOR)], _site("fc/kernel"), Action(None, (), "no rule")),
    ([Rule("fc", TENSOR), Rule("fc", None, role="gemm")], _site("fc/kernel"),
     Action(None, (0, 1), "a rule keeps it")),
    ([Rule("fc", TENSOR, op="einsum")], _site("fc/kernel"), Action(None, (), "no rule")),
    ([Rule("fc", TENSOR)], _site("fc/kernel", context=("shard_map",), entered=False),
     Action(None, (0,), "inside shard_map, which this route does not enter")),
    ([Rule("fc", TENSOR)], _site("fc/kernel", supported=False),
     Action(None, (0,), "a ragged_dot_general other than lax.ragged_dot's x [N, K] . "
            "w [E, K, F]")),
])
def test_decide_gives_the_config_of_the_rule_on_the_weight_or_says_why_not(rules, site, want):
  assert gemms.decide(Rules(rules), site) == want


def test_sites_list_every_gemm_with_its_action_from_an_abstract_trace():
  def loss(p, x):
    """A docstring kept by the wrapper."""
    return (x @ p["w"]) @ p["v"].T

  qloss = rules_lib.quantize_gemms(loss, [Rule("w", TENSOR)])
  assert qloss.__name__ == "loss" and qloss.__doc__ == "A docstring kept by the wrapper."
  sites, paths = qloss.sites({"w": SDS((4, 3), jnp.float32), "v": SDS((5, 3), jnp.float32)},
                             SDS((2, 4), jnp.float32))
  assert paths == ["v", "w", None]
  assert sites == [(Site("dot_general", (2, 4), (4, 3), None, "w"), Action(TENSOR, (0,))),
                   (Site("dot_general", (2, 3), (3, 5), None, "v"), Action(None, (), "no rule"))]


def test_strict_false_leaves_a_rule_that_quantizes_nothing_and_the_bits_alone():
  fn = lambda p, x: x @ p["w"]  # noqa: E731
  p, x = {"w": jnp.full((4, 3), 0.3)}, jnp.full((2, 4), 1.7)
  with pytest.raises(ValueError, match=r"rule 'nothing', role gemm \(rules\[0\]\)"):
    rules_lib.quantize_gemms(fn, [Rule("nothing", TENSOR)])(p, x)
  got = rules_lib.quantize_gemms(fn, [Rule("nothing", TENSOR)], strict=False)(p, x)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(fn(p, x)))


@pytest.mark.parametrize("rule, message", [
    (Rule(r"atn/qkv", TENSOR), r"^rule 'atn/qkv', role gemm \(rules\[0\]\) matches no GEMM "
     r"on a parameter of '<lambda>'; closest: 'attn/qkv'.* \(module_path must match a whole "
     r"'/'-joined path: re.fullmatch\)$"),
    (Rule("qkv", TENSOR), r"closest: 'attn/qkv', 'attn/qkv/kernel'"),  # re.search finds them
    (Rule("norm", TENSOR), r"it matches 'norm', which feeds no GEMM \(no dot_general takes "
     r"it through shape-only operations\)$"),
    (Rule("embed", TENSOR, op="einsum"), r"no einsum on a parameter .*: it matches 'embed', "
     r"which is used by dot_general GEMMs only, not einsum$"),
])
def test_a_rule_that_quantizes_nothing_is_refused_with_the_closest_paths(rule, message):
  fn, params = as_fn(fresh(TiedLM))
  with pytest.raises(ValueError, match=message):
    rules_lib.quantize_gemms(fn, [rule])(params, jnp.zeros(TOKENS.shape, TOKENS.dtype))


def test_parameters_closed_over_are_refused():
  fn, params = as_fn(fresh(TiedLM))
  with pytest.raises(ValueError, match=r"quantize_gemms: '<lambda>' has no array in its "
                                       r"parameter argument\(s\) \(1,\): pass the parameters"):
    rules_lib.quantize_gemms(lambda x, p: fn(params, x), [Rule(".*", TENSOR)], argnums=1)(
        jnp.zeros(TOKENS.shape, TOKENS.dtype), None)


def test_output_rules_are_refused_by_the_jaxpr_route():
  with pytest.raises(ValueError, match=r"rule 'head', role output \(rules\[0\]\): "
                                       r"quantize_gemms quantizes GEMMs"):
    rules_lib.quantize_gemms(lambda p, x: x, [Rule("head", fp8jax.preset("deepseek_v3"))])
