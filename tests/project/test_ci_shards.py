"""The CI hooks of tests/conftest.py: the slow tier's shards (the value parsed or refused, each
test in one), and the fast tier's time limit."""

import types

import pytest

from tests import conftest


@pytest.mark.parametrize("value,expected", [("all", None), ("0/6", (0, 6)), ("5/6", (5, 6))])
def test_shard_values(monkeypatch, value, expected):
  monkeypatch.setenv(conftest.SHARD_VARIABLE, value)
  assert conftest._shard() == expected  # pylint: disable=protected-access


@pytest.mark.parametrize("value", ["6/6", "-1/6", "1/0", "x", "1", "1/2/3"])
def test_a_bad_shard_is_refused_by_name(monkeypatch, value):
  monkeypatch.setenv(conftest.SHARD_VARIABLE, value)
  with pytest.raises(pytest.UsageError, match=conftest.SHARD_VARIABLE):
    conftest._shard()  # pylint: disable=protected-access


def test_every_test_is_in_one_shard():
  paths = [f"tests/test_{i % 7}.py::test_{i}" for i in range(200)]
  for k in (1, 4, 6):
    shards = [conftest.slow_shard(p, k) for p in paths]
    assert all(0 <= s < k for s in shards)
    assert shards == [conftest.slow_shard(p, k) for p in paths]  # stable
    if k > 1:
      assert len(set(shards)) == k  # 200 paths reach every shard


@pytest.mark.parametrize("duration,slow,outcome", [(6.0, False, "failed"), (4.0, False, "passed"),
                                                   (6.0, True, "passed")])
def test_a_fast_test_over_the_limit_fails(monkeypatch, duration, slow, outcome):
  monkeypatch.setenv(conftest.FAST_LIMIT_VARIABLE, "5")
  item = types.SimpleNamespace(nodeid="tests/x/test_y.py::test_z",
                               get_closest_marker=lambda name: object() if slow else None)
  call = types.SimpleNamespace(when="call", duration=duration)
  report = types.SimpleNamespace(passed=True, outcome="passed", longrepr=None)
  hook = conftest.pytest_runtest_makereport(item, call)
  next(hook)
  with pytest.raises(StopIteration):
    hook.send(types.SimpleNamespace(get_result=lambda: report))
  assert report.outcome == outcome
  if outcome == "failed":
    assert "test_z took 6.0 s, over the fast tier's 5 s" in report.longrepr
