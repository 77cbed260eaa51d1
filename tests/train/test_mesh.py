"""The data mesh's shardings (``fp8jax.train.mesh``), on an abstract 4-device mesh."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from fp8jax.train import mesh as mesh_lib


def _specs(tree, size, min_size=10):
  mesh = jax.sharding.AbstractMesh((size,), ("data",))
  shardings = mesh_lib.fsdp_sharding(
      jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), tree,
                   is_leaf=lambda x: isinstance(x, tuple)), mesh, min_size=min_size)
  return jax.tree.map(lambda s: s.spec, shardings,
                      is_leaf=lambda x: isinstance(x, jax.sharding.NamedSharding))


def test_fsdp_splits_the_largest_divisible_axis_of_large_leaves():
  tree = {"w": (6, 8), "square": (16, 8), "odd": (6, 6), "small": (2, 4),
          "layer_runs": {"k": (16, 2, 4)}}
  specs = _specs(tree, 4)
  assert specs["w"] == P(None, "data")  # 6 does not split in 4, 8 does
  assert specs["square"] == P("data", None)  # both split: the larger
  assert specs["odd"] == P()  # neither splits: replicated
  assert specs["small"] == P()  # 8 elements, under min_size
  assert specs["layer_runs"]["k"] == P(None, None, "data")  # never the run axis
  one = jax.tree.leaves(_specs(tree, 1), is_leaf=lambda x: isinstance(x, P))
  assert one == [P()] * 5  # one device: everything replicated
