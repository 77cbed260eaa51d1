"""`describe`'s reports of what runs (fp8jax.rules.description), by the hook route and by the
jaxpr route: one line per GEMM with its path, op, shapes and action, then the summaries."""

import jax
import jax.numpy as jnp
import pytest

from fp8jax import rules as rules_lib
from fp8jax.rules import Rule, description
from fp8jax.rules.jaxpr_route import Action, Site
from tests.rules.conftest import TENSOR, TOKENS, TiedLM, as_fn, fresh

SDS = jax.ShapeDtypeStruct


def test_config_name_names_a_recipe_else_describes_the_config():
  assert description.config_name(TENSOR) == "recipe fp8_tensor"
  assert description.config_name(TENSOR.replace(transpose="double")) == (
      "fp8/fp8/fp8 acc=fp32 transpose=double")


@pytest.mark.parametrize("site, action, want", [
    (Site("dot_general", (2, 3, 16), (16, 48), None, "attn/qkv/kernel", ("scan", "remat")),
     Action(TENSOR, (0, 2)),
     "attn/qkv/kernel  dot_general [2,3,16]x[16,48] in scan/remat  recipe fp8_tensor  "
     "(rules 0, 2)"),
    (Site("einsum", (2, 3), (3, 4), None, None), Action(note="no parameter operand"),
     "-  einsum [2,3]x[3,4]  not quantized: no parameter operand"),
    (Site("ragged_dot", (8, 4), (2, 4, 5), None, "experts/w"),
     Action(None, (1,), "a rule keeps it"),
     "experts/w  ragged_dot [8,4]x[2,4,5]  not quantized: a rule keeps it  (rules 1)"),
])
def test_site_line_shows_path_op_shapes_context_and_action(site, action, want):
  assert description.site_line(site, action) == want


def test_repeated_gemms_are_listed_once_with_their_count():
  def two(p, x):
    h = x @ p["w"]
    return (h @ h.T) + (h @ h.T)

  text = rules_lib.describe(two, [Rule("w", TENSOR)], {"w": SDS((4, 3), jnp.float32)},
                            SDS((2, 4), jnp.float32))
  assert text.splitlines() == [
      "GEMMs of 'two' (jaxpr route; abstract trace): 1 on parameters, 1 quantized, 2 on "
      "activations only",
      "w  dot_general [2,4]x[4,3]  recipe fp8_tensor  (rules 0)",
      "-  dot_general [2,3]x[3,2] (x2)  not quantized: no parameter operand"]


def test_the_hook_routes_report_shows_a_kernel_used_by_the_models_own_code():
  """``describe`` with inputs traces what runs: attn/qkv's hook is set but its kernel
  goes to a plain GEMM, which the report lists as not quantized."""
  text = rules_lib.describe(fresh(TiedLM), [Rule(r"attn/\w+", TENSOR)], TOKENS)
  lines = text.splitlines()
  assert lines[0] == ("GEMMs of TiedLM (hook route; abstract trace): 3 on parameters, 1 "
                      "quantized, 2 on activations only")
  assert lines[1] == ("attn/qkv/kernel  dot_general [2,3,16]x[16,48]  not quantized: the "
                      "model's own code, not the dot_general hook its rules set")
  assert "attn/out/kernel  dot_general [2,3,16]x[16,16]  recipe fp8_tensor  (rules 0)" in lines
  assert ("embed/embedding  dot_general [2,3,16]x[16,8]  not quantized: the model's own code "
          "(no hook)" in lines)
  assert lines[-2:] == ["hooks set but never called: attn/qkv (rules 0)",
                        "not quantized: the GEMMs on the parameters of attn/qkv, embed"]
  static = rules_lib.describe(fresh(TiedLM), [Rule(r"attn/\w+", TENSOR)]).splitlines()
  assert static[0] == "attn/out  gemm[dot_general]: recipe fp8_tensor  (rules 0)"
  assert static[-1].startswith("(the hooks set, not traced: describe(model, rules, *example")


def test_the_jaxpr_routes_report_lists_every_gemm_and_its_action():
  fn, params = as_fn(fresh(TiedLM))
  rules = [Rule(r"attn/.*", TENSOR), Rule("attn/out", None, role="gemm"), Rule("gone", TENSOR)]
  lines = rules_lib.describe(fn, rules, params, TOKENS).splitlines()
  assert lines == [
      "GEMMs of '<lambda>' (jaxpr route; abstract trace): 3 on parameters, 1 quantized, 2 on "
      "activations only",
      "attn/qkv/kernel  dot_general [2,3,16]x[16,48]  recipe fp8_tensor  (rules 0)",
      "-  dot_general [2,3,16]x[2,16,3]  not quantized: no parameter operand",
      "-  dot_general [2,3,3]x[2,3,16]  not quantized: no parameter operand",
      "attn/out/kernel  dot_general [2,3,16]x[16,16]  not quantized: a rule keeps it  "
      "(rules 0, 1)",
      "embed/embedding  dot_general [2,3,16]x[16,8]  not quantized: no rule",
      "not quantized: the GEMMs on the parameters of attn/out, embed",
      "unmatched: rules[2] rule 'gone', role gemm"]
