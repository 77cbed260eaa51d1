"""fp8jax.metrics.aggregate: float32 sums of squares, static group membership, masked group
sums and the grouped layout (hand-worked sums)."""

import jax.numpy as jnp
import numpy as np

from fp8jax.metrics import aggregate, paths

CLS = paths.Classifier.from_patterns({"attn": "/attn/", "head": "^head"},
                                     layer=r"^layers/(\d+)/", groups={"attn": "mixing"})
PATHS = ["layers/0/attn/kernel", "layers/1/attn/kernel", "head/kernel"]


def test_sum_sq_accumulates_bfloat16_in_float32():
  # 257 is not a bfloat16 number (8 significant bits): a bfloat16 sum would round it.
  got = aggregate.sum_sq(jnp.ones(257, jnp.bfloat16))
  assert got.dtype == jnp.float32 and float(got) == 257.0
  np.testing.assert_array_equal(aggregate.sum_sq(jnp.array([[1.0, 2.0], [3.0, 4.0]]), 1),
                                [5.0, 25.0])


def test_group_keys_and_membership():
  assert aggregate.group_keys("layers/1/attn/kernel", CLS) == {
      "by_module": "attn", "by_group": "mixing", "by_layer": "1", "by_module_layer": "attn/1"}
  assert aggregate.group_keys("head/kernel", CLS) == {
      "by_module": "head", "by_group": "other", "by_layer": "none"}
  groups, member = aggregate.membership(PATHS, CLS)
  assert groups == [("global", ""), ("by_module", "attn"), ("by_group", "mixing"),
                    ("by_layer", "0"), ("by_module_layer", "attn/0"), ("by_layer", "1"),
                    ("by_module_layer", "attn/1"), ("by_module", "head"),
                    ("by_group", "other"), ("by_layer", "none")]
  np.testing.assert_array_equal(member.astype(int), [
      [1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 1, 0],
      [0, 0, 1], [0, 0, 1], [0, 0, 1]])


def test_masked_sum_keeps_a_nonfinite_leaf_in_its_own_groups():
  totals = jnp.array([[1.0, 10.0], [np.inf, 20.0], [2.0, 30.0]])
  member = np.array([[True, False, True], [False, True, False], [True, True, True]])
  got = np.asarray(aggregate.masked_sum(totals, member))
  np.testing.assert_array_equal(got, [[3.0, 40.0], [np.inf, 20.0], [np.inf, 60.0]])


def test_grouped_by_expert_and_stack_rows():
  totals = jnp.array([[4.0], [9.0], [16.0]])
  out = aggregate.grouped(PATHS, totals, lambda s: {"sq": s[..., 0]}, CLS)
  assert float(out["global"]["sq"]) == 29.0
  column = lambda g: {k: float(v) for k, v in out[g].column("sq").items()}
  assert column("by_module") == {"attn": 13.0, "head": 16.0}
  assert column("by_group") == {"mixing": 13.0, "other": 16.0}
  assert column("by_layer") == {"0": 4.0, "1": 9.0, "none": 16.0}
  assert column("by_module_layer") == {"attn/0": 4.0, "attn/1": 9.0}
  assert column("per_param") == dict(zip(PATHS, [4.0, 9.0, 16.0]))
  per_slice = {"layers/0/attn/kernel": jnp.array([[1.0], [2.0]]),
               "layers/0/head": jnp.array([[3.0], [4.0]]),
               "layers/1/attn/kernel": jnp.array([[5.0], [6.0]])}
  experts = aggregate.by_expert(per_slice, CLS)
  np.testing.assert_array_equal(experts["0"], [[4.0], [6.0]])
  table = aggregate.stack_rows(experts, lambda s: {"sum": s[..., 0]})
  assert list(table) == ["0", "1"]
  np.testing.assert_array_equal(table["1"]["sum"], [5.0, 6.0])
  assert len(aggregate.stack_rows({}, lambda s: {})) == 0
