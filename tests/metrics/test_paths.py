"""fp8jax.metrics.paths: path strings of a pytree, layer and cell keys, classifiers built
from regexes or a saved table, and "direct" predicates."""

import pytest

from fp8jax.metrics import paths

CLS = paths.Classifier.from_patterns(
    {"attn_out": "/attn/out/", "attn": "/attn/", "embed": "^embed"}, layer=r"^layers/(\d+)/",
    groups={"attn_out": "attention", "attn": "attention"})


def test_flatten_joins_keys_in_leaf_order_and_refuses_clashes():
  tree = {"layers": [{"w": 1, "b": 2}, (3,)], "embed": 4}
  flat = paths.flatten(tree)
  assert list(flat.items()) == [("embed", 4), ("layers/0/b", 2), ("layers/0/w", 1),
                                ("layers/1/0", 3)]
  with pytest.raises(ValueError, match="share a path"):
    paths.flatten({"a/b": 1, "a": {"b": 2}})
  assert paths.split_path("layers/3/attn") == ["layers", "3", "attn"]


def test_layer_and_cell_keys():
  assert paths.layer_key(None) == "none" and paths.layer_key(7) == "7"
  assert paths.module_layer_key("attn/out", 12) == "attn/out/12"
  assert paths.split_module_layer_key("attn/out/12") == ("attn/out", 12)


def test_classifier_from_patterns_first_match_and_layers():
  assert CLS.module_of("layers/2/attn/out/kernel") == "attn_out"  # listed before "attn"
  assert CLS.module_of("layers/2/attn/q/kernel") == "attn"
  assert CLS.module_of("lm_head/kernel") == "other" and CLS.group_of("embed") == "other"
  assert CLS.layer_of("layers/12/attn/q/kernel") == 12 and CLS.layer_of("embed/w") is None
  assert CLS.group_of("attn_out") == "attention"
  assert CLS.modules == ("attn_out", "attn", "embed", "other")
  assert CLS.order(["zeta", "embed", "alpha", "attn_out"]) == [
      "attn_out", "embed", "alpha", "zeta"]
  with pytest.raises(ValueError, match="'attn'.*bad regex"):
    paths.Classifier.from_patterns({"attn": "("})
  with pytest.raises(ValueError, match="needs a group"):
    paths.Classifier.from_patterns({}, layer=r"^layers/\d+/")


def test_classifier_table_round_trip():
  names = ["layers/0/attn/out/kernel", "layers/1/attn/q/kernel", "embed/w"]
  table = CLS.to_table(names)
  assert table["paths"]["layers/1/attn/q/kernel"] == ["attn", 1, "attention", False]
  back = paths.Classifier.from_table(table)
  for name in names:
    assert (back.module_of(name), back.layer_of(name)) == (CLS.module_of(name),
                                                           CLS.layer_of(name))
    assert back.group_of(back.module_of(name)) == CLS.group_of(CLS.module_of(name))
  assert back.module_of("unlisted") == "other" and back.layer_of("unlisted") is None
  assert back.modules == CLS.modules


def test_as_predicate_prefixes_pairs_and_callables():
  by_prefix = paths.as_predicate("layers/0/attn/", CLS)
  assert by_prefix("layers/0/attn/out/kernel") and by_prefix("layers/0/attn")
  assert not by_prefix("layers/0/attn_x/kernel") and not by_prefix("layers/10/attn/q")
  by_pair = paths.as_predicate([("attn", 1), ("embed", None)], CLS)
  assert by_pair("layers/1/attn/q/kernel") and by_pair("embed/w")
  assert not by_pair("layers/0/attn/q/kernel") and not by_pair("layers/1/attn/out/kernel")
  always = lambda p: True
  assert paths.as_predicate(always, CLS) is always and paths.as_predicate(None, CLS) is None
  with pytest.raises(ValueError, match="bad .module, layer. pair"):
    paths.as_predicate([("mlp", 0)], CLS)
