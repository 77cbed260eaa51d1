"""Fixtures of the study's tests: a synthetic sweep folder with known numbers
(``tests.study.test_sweep_report.build``) and its loaded results, one per test module."""

import pytest

from fp8jax.study.common import results


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  from tests.study.test_sweep_report import build  # pylint: disable=import-outside-toplevel
  return build(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="module")
def res(sweep):  # pylint: disable=redefined-outer-name
  return results.load(sweep)
