"""A checkpoint's branches run in groups (each beside its own pass of the reference) give
the rows of one group, with the checkpoint read once or again per group
(fp8jax.study.branches.branch_engine, on the tiny run of ``train_run``)."""

import pytest

from fp8jax.study.branches import branch
from fp8jax.study.common import results_io
from fp8jax.train import checkpoint as ckpt_lib


def _rows(out) -> dict:
  rows = {(r["from_step"], r["branch"]): r for r in results_io.read(out / "branches.jsonl")}
  return rows


@pytest.mark.slow
def test_groups_of_one_branch_give_the_rows_of_one_group(train_run, tmp_path, monkeypatch):
  reads = []
  restore = ckpt_lib.Checkpointer.restore

  def counted(self, step, *args, **kwargs):
    reads.append(step)
    return restore(self, step, *args, **kwargs)

  monkeypatch.setattr(ckpt_lib.Checkpointer, "restore", counted)
  run = lambda out, **kw: branch.run(  # noqa: E731
      train_run, tmp_path / out, policies=["attn_l0_e4m3"], from_steps=[2],
      branches=branch.Branches(k=2), **kw)
  together = run("together")
  assert (together["groups"], together["together"], reads) == (1, None, [2])
  reads.clear()
  kept = run("kept", max_together=1)  # the noise branch, then the policy branch
  assert (kept["groups"], kept["together"], reads) == (2, 1, [2])  # read once, kept on host
  reads.clear()
  reread = run("reread", max_together=1, keep_restored=False)
  assert (reread["groups"], reads) == (2, [2, 2])
  rows = _rows(tmp_path / "together")
  assert set(rows) == {(2, "bf16"), (2, "noise"), (2, "attn_l0_e4m3")}
  assert rows == _rows(tmp_path / "kept") == _rows(tmp_path / "reread")
  assert rows[(2, "attn_l0_e4m3")]["param_div"][-1] > 0
