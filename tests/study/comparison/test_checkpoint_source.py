"""The sweep's checkpoint sources: params in memory by step, and a run folder's verified
checkpoints, read back as saved."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp8jax.study.comparison import checkpoint_source
from fp8jax.train import checkpoint
from fp8jax.train import mesh as mesh_lib
from fp8jax.train import step as step_lib

PARAMS = {"w": jnp.arange(6.0).reshape(2, 3), "b": {"bias": jnp.ones(3, jnp.bfloat16)}}


def _abstract(params):
  rep = mesh_lib.replicated(mesh_lib.data_mesh(jax.devices()[:1]))
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), params)


def test_params_in_memory_by_step_or_one_tree():
  later = jax.tree.map(lambda x: x + 1, PARAMS)
  source = checkpoint_source.InMemory({4: later, 0: PARAMS})
  assert source.steps == (0, 4) and source.workdir == ""
  got = source.load(4, _abstract(PARAMS))
  jax.tree.map(np.testing.assert_array_equal, got, later)
  assert got["w"].sharding == _abstract(PARAMS)["w"].sharding
  one = checkpoint_source.InMemory(PARAMS)  # one params tree: step 0
  assert one.steps == (0,)
  jax.tree.map(np.testing.assert_array_equal, one.load(0, _abstract(PARAMS)), PARAMS)
  with pytest.raises(KeyError):
    one.load(1, _abstract(PARAMS))


def test_a_run_folder_reads_its_checkpoints_params(tmp_path):
  tx = optax.sgd(1e-3)
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", save_every=1)
  for step in (0, 2):
    params = jax.tree.map(lambda x, s=step: x + s, PARAMS)
    ckpt.save(step, step_lib.init_state(params, tx), {"step": step}, {}, force=True)
  ckpt.close()
  source = checkpoint_source.RunFolder(tmp_path)
  try:
    assert source.steps == (0, 2) and source.workdir == str(tmp_path.resolve())
    jax.tree.map(np.testing.assert_array_equal, source.load(2, _abstract(PARAMS)),
                 jax.tree.map(lambda x: x + 2, PARAMS))
  finally:
    source.close()
