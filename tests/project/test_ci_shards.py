"""The slow tier's shards (tests/conftest.py): the value parsed or refused, each test in one."""

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
