"""Compiling a sweep's functions together (fp8jax.train.parallel_compile): when it runs, and
that compare's and branch's own calls then compile nothing again."""

import collections
import io
import logging
import re

import jax
import jax.numpy as jnp
import pytest

from fp8jax.study.branches import branch
from fp8jax.study.common import results_io
from fp8jax.study.comparison import sweep
from fp8jax.train import parallel_compile as pc


def test_threads_follow_the_cores_and_the_environment():
  assert pc.default_workers(8, cores=2, environ={}) == 0  # a small machine: at first calls
  assert pc.default_workers(8, cores=16, environ={}) == 8
  assert pc.default_workers(3, cores=16, environ={}) == 3
  assert pc.default_workers(8, cores=6, environ={}) == 3
  assert pc.default_workers(8, cores=2, environ={pc.ENV: "4"}) == 4
  assert pc.default_workers(2, cores=64, environ={pc.ENV: "0"}) == 0
  with pytest.raises(ValueError, match=pc.ENV):
    pc.default_workers(2, environ={pc.ENV: "many"})


def _never():
  raise AssertionError("lowered although nothing should be compiled")


def test_nothing_happens_without_a_cache_or_threads(monkeypatch):
  both = {"a": _never, "b": _never}
  assert pc.fill_cache(both, io.StringIO(), workers=1) is None
  assert pc.fill_cache({"a": _never}, io.StringIO(), workers=4) is None
  monkeypatch.setattr(pc, "cache_on", lambda: False)
  assert pc.fill_cache(both, io.StringIO(), workers=4) is None


def test_a_failure_is_a_warning_and_the_first_calls_compile():
  log = io.StringIO()
  f = jax.jit(lambda x: x + 1)
  fill = {"good": lambda: f.lower(jnp.ones(3)), "bad": lambda: 1 / 0}
  if not pc.cache_on():
    pytest.skip("the persistent cache is off in this session")
  assert pc.fill_cache(fill, log, "t", workers=2) is None
  assert "[t] warning: compiling together failed (ZeroDivisionError" in log.getvalue()


class _Compiles(logging.Handler):
  """Counts JAX's "Finished XLA compilation of jit(NAME)" lines (compiled or loaded from
  the persistent cache; an executable reused in memory logs nothing)."""

  def __init__(self):
    super().__init__()
    self.count = collections.Counter()

  def emit(self, record):
    m = re.match(r"Finished XLA compilation of jit\((\w+)\)", record.getMessage())
    if m:
      self.count[m.group(1)] += 1


@pytest.fixture
def compiles():
  handler, logger = _Compiles(), logging.getLogger("jax")
  logger.addHandler(handler)
  before = jax.config.jax_log_compiles
  jax.config.update("jax_log_compiles", True)  # the context manager's is per thread
  try:
    yield handler.count
  finally:
    jax.config.update("jax_log_compiles", before)
    logger.removeHandler(handler)


@pytest.mark.slow
def test_compare_and_branch_calls_reuse_what_was_compiled_together(train_run, tmp_path,
                                                                    monkeypatch, compiles):
  """Each function is compiled once, by the fill (lowered on abstract inputs): the sweep's
  and the branch-off run's own calls (on restored checkpoints) find it. A delayed-scaling
  policy's branch also runs from a second checkpoint (its empty histories, once donated
  by the first branch's step, are copied per branch)."""
  if not pc.cache_on():
    pytest.skip("the persistent cache is off in this session")
  monkeypatch.setenv(pc.ENV, "2")
  log = io.StringIO()
  sweep.run(train_run, tmp_path / "cmp", policies=["attn_l0_e4m3", "moe_l1-2_e4m3_delayed"],
            steps=[2, 4], windows=sweep.Windows(offsets=(0,), batches=1, batch_size=2),
            delayed_warmup=1, stream=log)
  assert "[compare] compiled 5 functions" in log.getvalue(), log.getvalue()
  assert "warning" not in log.getvalue()
  assert (compiles["baseline"], compiles["floor"], compiles["warm"]) == (1, 1, 1), compiles
  assert compiles["variant"] == 2, compiles
  compiles.clear()
  branch.run(train_run, tmp_path / "br", policies=["moe_l1-2_e4m3_delayed"],
             from_steps=[2, 4], branches=branch.Branches(k=1), stream=log)
  assert "[branch] compiled 2 functions" in log.getvalue(), log.getvalue()
  assert "warning" not in log.getvalue()
  assert compiles["step"] == 2, compiles  # the reference's and the policy's
  rows = {(r["from_step"], r["branch"]): r for r in results_io.read(tmp_path / "br" /
                                                                    "branches.jsonl")}
  assert all(rows[(s, "moe_l1-2_e4m3_delayed")]["finite"] == [True] for s in (2, 4))
