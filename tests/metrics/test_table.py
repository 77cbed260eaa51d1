"""fp8jax.metrics.table: named rows over array columns, kept whole through ``jax.jit``."""

import jax
import jax.numpy as jnp
import numpy as np

from fp8jax.metrics.table import Table


def _table():
  return Table(["attn", "mlp", "head"], {"norm": jnp.array([1.0, 2.0, 3.0]),
                                         "per_expert": jnp.arange(6.0).reshape(3, 2)})


def test_rows_columns_and_mapping_protocol():
  t = _table()
  assert len(t) == 3 and list(t) == ["attn", "mlp", "head"]
  assert "mlp" in t and "lm_head" not in t
  row = t["mlp"]
  assert float(row["norm"]) == 2.0
  np.testing.assert_array_equal(row["per_expert"], [2.0, 3.0])
  assert {k: float(v) for k, v in t.column("norm").items()} == {
      "attn": 1.0, "mlp": 2.0, "head": 3.0}
  assert dict(t.items())["head"]["norm"] == 3.0


def test_a_table_is_a_pytree_whose_names_survive_jit():
  t = _table()
  leaves = jax.tree.leaves(t)  # one leaf per column, sorted by column name
  np.testing.assert_array_equal(leaves[0], [1.0, 2.0, 3.0])
  assert len(leaves) == 2
  doubled = jax.jit(lambda x: jax.tree.map(lambda v: 2 * v, x))(t)
  assert isinstance(doubled, Table) and doubled.names == t.names
  np.testing.assert_array_equal(doubled.columns["per_expert"][2], [8.0, 10.0])
  host = jax.device_get(doubled)
  assert isinstance(host, Table) and float(host["attn"]["norm"]) == 2.0
  paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(t)[0]]
  assert paths == ["['norm']", "['per_expert']"]
