"""Where ``"auto"`` may take a Pallas GPU kernel (``fp8jax.kernels.placement``): the
backend, the context mesh's size and axis types, and the device's compute capability."""

from __future__ import annotations

import types

import jax
import pytest

from fp8jax.kernels import placement

_AXIS = jax.sharding.AxisType


def _mesh(sizes, types_):
  names = tuple(f"a{i}" for i in range(len(sizes)))
  return jax.sharding.AbstractMesh(tuple(sizes), names, axis_types=tuple(types_))


def _device(monkeypatch, cc):
  """The first device has ``compute_capability`` ``cc`` (no such attribute when None)."""
  device = types.SimpleNamespace() if cc is None else types.SimpleNamespace(
      compute_capability=cc)
  monkeypatch.setattr(jax, "devices", lambda: [device])


def test_kernels_only_on_a_gpu_backend():
  assert placement.kernels_allowed("gpu")
  for backend in ("cpu", "tpu", "rocm"):
    assert not placement.kernels_allowed(backend), backend


def test_default_backend_is_read_when_none_is_given(monkeypatch):
  assert not placement.kernels_allowed()  # the tests run on the CPU
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert placement.kernels_allowed()


@pytest.mark.parametrize("sizes,axis_types,allowed", [
    ((2,), (_AXIS.Explicit,), False),
    ((2,), (_AXIS.Auto,), False),
    ((2, 2), (_AXIS.Manual, _AXIS.Explicit), False),  # one axis still partitioned by XLA
    ((2,), (_AXIS.Manual,), True),  # inside a shard_map
    ((2, 4), (_AXIS.Manual, _AXIS.Manual), True),
    ((1,), (_AXIS.Explicit,), True),  # one device: nothing to partition
    ((1, 1), (_AXIS.Auto, _AXIS.Explicit), True),
], ids=["explicit", "auto", "partly-manual", "manual", "all-manual", "one-device",
        "one-device-2d"])
def test_under_a_mesh_kernels_need_one_device_or_every_axis_manual(sizes, axis_types,
                                                                   allowed):
  with jax.sharding.use_abstract_mesh(_mesh(sizes, axis_types)):
    assert placement.kernels_allowed("gpu") is allowed
    assert not placement.kernels_allowed("cpu")


@pytest.mark.parametrize("cc,want", [("9.0", (9, 0)), ("8.9", (8, 9)), ("10.0", (10, 0)),
                                     ("12.1", (12, 1)), ("9.0.1", (9, 0)), ("9", None),
                                     ("", None), (None, None)])
def test_compute_capability_parses_major_and_minor(monkeypatch, cc, want):
  _device(monkeypatch, cc)
  assert placement.compute_capability() == want


def test_the_cpu_device_has_no_compute_capability():
  assert placement.compute_capability() is None
  assert not placement.capability_at_least(0)


@pytest.mark.parametrize("cc,major,minor,want", [
    ("9.0", 9, 0, True), ("9.0", 8, 9, True), ("8.9", 9, 0, False), ("8.9", 8, 9, True),
    ("8.6", 8, 9, False), ("10.0", 9, 0, True), ("9.0", 9, 1, False), (None, 7, 0, False),
])
def test_capability_at_least_compares_major_then_minor(monkeypatch, cc, major, minor, want):
  _device(monkeypatch, cc)
  assert placement.capability_at_least(major, minor) is want
