"""Params-only checkpoints (``train.full_state="last"``): what stays on disk, what reads them.

``train_run`` (tests/conftest.py) is a tiny run with full checkpoints 0, 2, 4; the slow
test trains the same run with ``full_state="last"`` and compares the two.
"""

import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fp8jax.study.common import results_io
from fp8jax.study.comparison import sweep
from fp8jax.train import checkpoint, checkpoint_digest, full_state, loop, run_config, verify
from fp8jax.train import step as step_lib


def _state(i: int):
  params = {"w": jnp.arange(16, dtype=jnp.float32).reshape(4, 4) / 3 + i, "b": jnp.ones(4) * i}
  tx = optax.adam(1e-3)
  opt = jax.tree.map(lambda x: x + i, tx.init(params))
  return step_lib.TrainState(jnp.int32(i), params, opt)


def _optimizer_steps(directory) -> list[int]:
  return sorted(int(p.name) for p in pathlib.Path(directory).iterdir()
                if p.name.isdigit() and (p / full_state.ITEM).is_dir())


@pytest.mark.slow
def test_only_the_newest_and_listed_checkpoints_keep_the_optimizer_state(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path / "c", 1, full_state="last", keep_full=(1,),
                                 params_dtype="bfloat16")
  for i in range(4):
    ckpt.save(i, _state(i), {"step": i}, {"model": "toy"})
  ckpt.wait()
  ckpt.close()
  ckpt = checkpoint.Checkpointer(tmp_path / "c", 1)  # a reader, as compare and verify are
  assert ckpt.all_steps() == [0, 1, 2, 3] and _optimizer_steps(tmp_path / "c") == [1, 3]
  like = checkpoint.abstract_like(_state(0))
  state, position, _ = ckpt.restore(3, like)  # the exact FP32 params, from the master copy
  assert position == {"step": 3}
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(_state(3))):
    np.testing.assert_array_equal(a, b)
  # stored in BF16, read back as FP32 (a partial restore: a reader of its own)
  params, _ = checkpoint.Checkpointer(tmp_path / "c", 1).restore_params(0, like.params)
  assert params["w"].dtype == jnp.float32
  np.testing.assert_array_equal(params["w"], _state(0).params["w"].astype(jnp.bfloat16))
  with pytest.raises(full_state.ParamsOnlyCheckpointError) as e:
    ckpt.restore(2, like, "--resume")
  assert "\n" not in str(e.value)
  assert "step 2" in str(e.value) and "train.full_state" in str(e.value)
  assert "steps [1, 3]" in str(e.value)
  status = ckpt.verify(0, like)
  assert status.params_only and "params only" in checkpoint_digest.describe(status)
  assert not ckpt.verify(3, like).params_only
  ckpt.close()


def test_no_drop_before_the_newer_optimizer_state_checks_out(tmp_path, capsys):
  ckpt = checkpoint.Checkpointer(tmp_path / "c", 1, full_state="last")
  ckpt.save(0, _state(0), {"step": 0}, {})
  ckpt.save(1, _state(1), {"step": 1}, {})
  ckpt.manager.wait_until_finished()
  (tmp_path / "c" / "1" / full_state.ITEM / "commit_success.txt").unlink()  # as if torn
  ckpt.wait()
  assert _optimizer_steps(tmp_path / "c") == [0, 1]
  assert "kept the older optimizer states" in capsys.readouterr().err
  # A drop killed after its rename leaves a folder no restore reads; the next drop deletes it.
  (tmp_path / "c" / "0" / full_state.ITEM).rename(tmp_path / "c" / "0" / "optimizer.dropped")
  full_state.drop(tmp_path / "c" / "0")
  assert {"state", "meta"} <= set(os.listdir(tmp_path / "c" / "0"))
  assert not {full_state.ITEM, "optimizer.dropped"} & set(os.listdir(tmp_path / "c" / "0"))
  ckpt.close()


@pytest.mark.parametrize("key, value, error", [
    ("full_state", "newest", "train.full_state must be one of"),
    ("full_state_steps", (2, -1), "train.full_state_steps must be a tuple of steps"),
    ("checkpoint_params_dtype", "float16", "train.checkpoint_params_dtype must be one of"),
    ("checkpoint_params_dtype", "bfloat16", "needs train.full_state='last'"),
])
def test_bad_options_are_named(key, value, error):
  c = run_config.defaults()
  c.optim.warmup_steps, c.train[key] = 1, value
  with pytest.raises(ValueError, match=error):
    run_config.check(c)


def _rows(out):
  key = lambda r: (r["step"], r["offset"], r["batch"], r["policy"])  # noqa: E731
  return sorted(results_io.read(out / "rows.jsonl"), key=key)


@pytest.mark.slow
def test_compare_verify_resume_and_branch_on_params_only_checkpoints(train_run, tmp_path):
  c = run_config.load_saved(train_run)  # the same run, its checkpoints params-only but 4
  c.train.full_state, c.optim.total_steps = "last", c.train.steps  # the same schedule
  work = tmp_path / "last"
  loop.train(c, work)
  assert _optimizer_steps(work / "checkpoints") == [4]
  assert [s.params_only for _, s in verify.verify_run(work)] == [True, True, False]
  windows = sweep.Windows(offsets=(0,), batches=1, batch_size=2)
  for run, out in ((train_run, tmp_path / "full_cmp"), (work, tmp_path / "last_cmp")):
    sweep.run(run, out, policies=["attn_l0_e4m3"], windows=windows, telemetry=False)
  full, last = _rows(tmp_path / "full_cmp"), _rows(tmp_path / "last_cmp")
  assert len(full) == 3 * 2 and json.dumps(last) == json.dumps(full)
  c.train.steps = 6  # resumes from the newest, then drops its optimizer state
  assert loop.train(c, work, resume=True)["final_step"] == 6
  assert _optimizer_steps(work / "checkpoints") == [6]
  for path in (work / "checkpoints" / "6").iterdir():  # as if the newest were lost
    path.rename(tmp_path / path.name)
  (work / "checkpoints" / "6").rmdir()
  c.train.steps = 8
  with pytest.raises(full_state.ParamsOnlyCheckpointError,
                     match=r"^--resume needs the optimizer state, .* at step 4 .*"
                           r"train\.full_state='last'"):
    loop.train(c, work, resume=True)
  from fp8jax.study.branches import branch  # pylint: disable=import-outside-toplevel
  with pytest.raises(full_state.ParamsOnlyCheckpointError,
                     match=r"^branch needs .* steps \[2, 4\] .*: none"):
    branch.run(work, tmp_path / "branch", policies=["attn_l0_e4m3"], from_steps=[2, 4],
               branches=branch.Branches(k=2))
