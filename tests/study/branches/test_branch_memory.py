"""How many branches fit on a device, and a restored state kept in host memory between a
checkpoint's groups of branches (fp8jax.study.branches.branch_memory)."""

import types
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.study.branches import branch_memory


class _State(NamedTuple):
  params: Any
  opt_state: Any


def _abstract():
  # params: 4 x 5 float32 = 80 bytes; opt_state: two of them = 160 bytes; state = 240.
  leaf = jax.ShapeDtypeStruct((4, 5), jnp.float32)
  return _State(params={"w": leaf}, opt_state=(leaf, leaf))


def _mesh(limit=None, devices=1):
  stats = {} if limit is None else {"bytes_limit": limit}
  dev = types.SimpleNamespace(memory_stats=lambda: stats)
  return types.SimpleNamespace(devices=np.array([dev] * devices, dtype=object))


def test_state_bytes_counts_each_dtype_and_splits_under_fsdp():
  tree = {"a": jax.ShapeDtypeStruct((3, 4), jnp.float32),
          "b": jax.ShapeDtypeStruct((6,), jnp.bfloat16)}
  assert branch_memory.state_bytes(tree, devices=2, fsdp=False) == 3 * 4 * 4 + 6 * 2
  assert branch_memory.state_bytes(tree, devices=2, fsdp=True) == (48 + 12) // 2


def test_branches_that_fit_count_the_reference_and_the_steps_temporary_memory():
  # Each branch: state 240 + params copy 80 = 320 bytes; the reference as much.
  abstract = _abstract()
  # 0.9 * 4000 = 3600; minus the reference 320 and the step's 500 = 2780 -> 8 branches.
  assert branch_memory.auto_together(abstract, _mesh(4000), False, 500) == 8
  # Without the step's figure, one more train state (240) is kept back: 3040 -> 9.
  assert branch_memory.auto_together(abstract, _mesh(4000), False) == 9
  # Split over 2 devices (FSDP): 160 per branch; 3600 - 160 - 500 = 2940 -> 18.
  assert branch_memory.auto_together(abstract, _mesh(4000, 2), True, 500) == 18
  # Too little memory still steps one branch at a time; no memory figure: all at once.
  assert branch_memory.auto_together(abstract, _mesh(100), False, 500) == 1
  assert branch_memory.auto_together(abstract, _mesh(None), False, 500) is None


def test_temp_bytes_reads_the_compiled_programs_memory_analysis():
  analysed = types.SimpleNamespace(
      memory_analysis=lambda: types.SimpleNamespace(temp_size_in_bytes=1234))
  assert branch_memory.temp_bytes(analysed) == 1234

  def unsupported():
    raise NotImplementedError("no memory analysis here")

  assert branch_memory.temp_bytes(types.SimpleNamespace(memory_analysis=unsupported)) is None
  assert branch_memory.temp_bytes(types.SimpleNamespace(memory_analysis=lambda: None)) is None


def _placed():
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  state = {"w": jax.device_put(np.arange(6, dtype=np.float32).reshape(2, 3), sharding),
           "m": jax.device_put(np.full((4,), 7, np.int32), sharding)}
  return state, {"w": sharding, "m": sharding}


def test_later_groups_get_the_state_back_from_host_memory_not_from_disk():
  state, sharding = _placed()
  expected = jax.device_get(state)
  reads = []
  source = branch_memory.RestoredState(state, sharding, groups=3,
                                       reread=lambda: reads.append(1))
  assert source.copied
  first = source.take()
  assert first is state
  jax.tree.map(lambda a: a.delete(), first)  # the first group's steps donate its buffers
  for _ in range(2):
    again = source.take()
    assert jax.tree.map(lambda a: a.sharding.memory_kind, again) == {"w": "device",
                                                                    "m": "device"}
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(again), expected)
  assert not reads


@pytest.mark.parametrize("groups,keep,room", [(1, True, True), (3, False, True),
                                              (3, True, False)])
def test_the_checkpoint_is_read_again_when_no_copy_is_kept(groups, keep, room, monkeypatch):
  if not room:  # this host has too little free memory for the state
    monkeypatch.setattr(branch_memory, "host_bytes_available", lambda: 10)
  state, sharding = _placed()
  reads = []
  source = branch_memory.RestoredState(state, sharding, groups, keep=keep,
                                       reread=lambda: reads.append(1) or "read again")
  assert not source.copied
  assert source.take() is state
  assert source.take() == "read again" and reads == [1]


def test_host_memory_holds_every_devices_copy_of_the_state(monkeypatch):
  state, _ = _placed()  # 24 + 16 bytes on one device
  monkeypatch.setattr(branch_memory, "host_bytes_available", lambda: 80)
  assert branch_memory.fits_in_host(state)  # 40 <= half of 80
  monkeypatch.setattr(branch_memory, "host_bytes_available", lambda: 79)
  assert not branch_memory.fits_in_host(state)
  monkeypatch.setattr(branch_memory, "host_bytes_available", lambda: None)
  assert not branch_memory.fits_in_host(state)


def test_available_host_memory_counts_the_page_cache_the_kernel_can_drop(tmp_path):
  meminfo = tmp_path / "meminfo"
  meminfo.write_text("MemTotal:       131072000 kB\nMemFree:          1048576 kB\n"
                     "MemAvailable:   120000000 kB\nCached:         100000000 kB\n")
  assert branch_memory.host_bytes_available(str(meminfo)) == 120000000 * 1024
  assert branch_memory.host_bytes_available(str(tmp_path / "none")) > 0  # the free pages
