"""What a workdir may take (``fp8jax.train.workdir_checks``): a run is not overwritten, a run
without checkpoints not resumed, and a resume under fewer steps, another config or another
precision policy refused by name (checkpoints faked as step folders, their policy records
given by hand)."""

import io
import json
import re

import pytest

from fp8jax.train import run_config, workdir_checks


def _record(policy, expr):
  """A policy record as a model's ``record`` makes it (here: from the expression)."""
  del policy
  return {"expression": expr, "name": expr}


def _fake_reader(monkeypatch, name: str) -> dict:
  """``{step: value, or an exception for a checkpoint whose meta does not read}``, what
  ``checkpoint.<name>`` (``saved_policy``, ``saved_meta``) returns for the fake
  checkpoints."""
  values = {}

  def read(ckpts, step):
    del ckpts
    if isinstance(values[step], Exception):
      raise values[step]
    return values[step]

  monkeypatch.setattr(workdir_checks.ckpt_lib, name, read)
  return values


@pytest.fixture
def saved_records(monkeypatch):
  """The policy records of the fake checkpoints (:func:`_fake_reader`)."""
  return _fake_reader(monkeypatch, "saved_policy")


def _run(workdir, steps=(0,), cfg=None, policy="bf16"):
  """A workdir as a run leaves it: ``checkpoints/<step>`` folders and its config.json."""
  for step in steps:
    (workdir / "checkpoints" / str(step)).mkdir(parents=True)
  cfg = cfg or run_config.defaults()
  cfg.policy = policy
  (workdir / "config.json").write_text(cfg.to_json())
  return workdir


def _check(workdir, cfg=None, resume=True, allow=False, stream=None):
  cfg = cfg or run_config.defaults()
  return workdir_checks.check(workdir, cfg, resume, "the policy", allow, stream,
                              record=_record)


def test_a_workdir_without_checkpoint_folders_or_logged_rows_holds_no_run(tmp_path):
  assert _check(tmp_path / "new", resume=False) is False
  (tmp_path / "checkpoints" / "4.incomplete").mkdir(parents=True)  # not a step folder
  (tmp_path / "metrics.jsonl").write_text("")
  assert _check(tmp_path, resume=False) is False
  assert _check(tmp_path, resume=True) is False  # nothing to resume: a fresh start


def test_a_run_is_not_overwritten_without_resume(tmp_path, saved_records):
  _run(tmp_path)
  with pytest.raises(FileExistsError, match=rf"^{re.escape(str(tmp_path))} already holds a "
                                            "training run; pass --resume to continue it"):
    _check(tmp_path, resume=False)
  saved_records[0] = _record(None, "bf16")
  assert _check(tmp_path, resume=True) is True


def test_a_run_that_saved_no_checkpoint_is_neither_overwritten_nor_resumed(tmp_path):
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
  with pytest.raises(FileExistsError, match=r"saved no checkpoint \(its metrics.jsonl has "
                                            r"rows\); choose a new workdir"):
    _check(tmp_path, resume=False)
  with pytest.raises(ValueError, match=r"--resume: the run in .* saved no checkpoint "
                                       r"\(train.checkpoints=False\), so it cannot be resumed"):
    _check(tmp_path, resume=True)


def test_resuming_with_fewer_steps_than_the_newest_checkpoint_names_it(tmp_path, saved_records):
  _run(tmp_path, steps=(0, 4, 10))  # 10 is the newest, though "4" > "10" as text
  (tmp_path / "checkpoints" / "12.incomplete").mkdir()
  cfg = run_config.defaults()
  cfg.train.steps = 6
  with pytest.raises(ValueError, match=r"--resume with train.steps 6, but the run in .* has "
                                       r"reached step 10 \(its latest checkpoint\): "
                                       r"train.steps must be >= 10; nothing was changed"):
    _check(tmp_path, cfg)


def test_a_resume_under_another_config_names_every_changed_key(tmp_path, saved_records):
  _run(tmp_path)
  saved_records[0] = _record(None, "bf16")
  cfg = run_config.defaults()
  cfg.seed, cfg.data.seq_len, cfg.train.log_every = 1, 64, 5  # log_every may change
  with pytest.raises(ValueError, match=rf"differs from {re.escape(str(tmp_path))}/config.json "
                                       r"in \['data.seq_len', 'seed'\]; only data.skip_bad"):
    _check(tmp_path, cfg)


def test_a_resume_prints_each_change_it_allows(tmp_path, saved_records):
  old = run_config.defaults()
  old.optim.total_steps = 200  # a fixed schedule: train.steps may grow
  _run(tmp_path, cfg=old)
  saved_records[0] = _record(None, "bf16")
  cfg = run_config.defaults()
  cfg.optim.total_steps = 200
  cfg.train.steps, cfg.train.log_every = 150, 5
  out = io.StringIO()
  assert _check(tmp_path, cfg, stream=out) is True
  assert out.getvalue().splitlines() == ["[train] --resume changes train.log_every: 10 -> 5",
                                         "[train] --resume changes train.steps: 100 -> 150"]


def test_train_steps_may_not_change_when_the_schedule_follows_them(tmp_path, saved_records):
  _run(tmp_path)  # optim.total_steps = 0: the LR schedule spans train.steps
  saved_records[0] = _record(None, "bf16")
  cfg = run_config.defaults()
  cfg.train.steps = 150
  with pytest.raises(ValueError, match=r"in \['train.steps'\]; .* train.steps only with "
                                       r"optim.total_steps set"):
    _check(tmp_path, cfg)


def test_another_policy_is_refused_naming_both_and_allowed_with_a_warning(
    tmp_path, saved_records):
  _run(tmp_path, steps=(0, 4))
  saved_records[4] = _record(None, "bf16")
  cfg = run_config.defaults()
  cfg.policy = "attn@0:e4m3"
  checkpoint = re.escape(str(tmp_path / "checkpoints" / "4"))
  with pytest.raises(workdir_checks.PolicyMismatchError,
                     match=rf"trained with policy 'bf16' \(checkpoint {checkpoint}\), the config "
                           r"asks for 'attn@0:e4m3' \('bf16' \(name 'bf16'\) vs 'attn@0:e4m3'"):
    _check(tmp_path, cfg)
  out = io.StringIO()
  assert _check(tmp_path, cfg, allow=True, stream=out) is True
  assert out.getvalue() == (
      f"warning: --allow_policy_change: the run was trained with policy 'bf16' (checkpoint "
      f"{tmp_path / 'checkpoints' / '4'}) and continues under policy 'attn@0:e4m3' ('bf16' "
      f"(name 'bf16') vs 'attn@0:e4m3' (name 'attn@0:e4m3'), differing in ['expression', "
      f"'name'])\n")


def test_the_policy_of_a_torn_newest_checkpoint_is_read_from_the_one_before(
    tmp_path, saved_records):
  _run(tmp_path, steps=(0, 4, 8))
  saved_records.update({8: OSError("torn"), 4: _record(None, "moe@1:e4m3"), 0: None})
  cfg = run_config.defaults()
  cfg.policy = "moe@1:e4m3"  # config.json says "bf16"; the checkpoint's record decides
  assert _check(tmp_path, cfg) is True
  cfg.policy = "bf16"
  with pytest.raises(workdir_checks.PolicyMismatchError,
                     match=rf"policy 'moe@1:e4m3' \(checkpoint {re.escape(str(tmp_path))}"
                           r"/checkpoints/4\), the config asks for 'bf16'"):
    _check(tmp_path, cfg)


def test_without_a_readable_record_the_config_json_expression_decides(tmp_path, saved_records):
  _run(tmp_path, steps=(0, 4), policy="bf16")
  saved_records.update({4: OSError("torn"), 0: None})  # 0: saved before records existed
  cfg = run_config.defaults()
  cfg.policy = "attn@0:e4m3"
  with pytest.raises(workdir_checks.PolicyMismatchError,
                     match=r"trained with policy 'bf16' \(its config.json\), the config asks "
                           r"for 'attn@0:e4m3' \(the expressions differ\)"):
    _check(tmp_path, cfg)
  cfg.policy = "bf16"
  assert _check(tmp_path, cfg) is True


def test_a_run_without_config_json_is_checked_against_its_checkpoints_config(
    tmp_path, saved_records, monkeypatch):
  _run(tmp_path, steps=(0, 2, 4))
  (tmp_path / "config.json").unlink()
  for step in (0, 2, 4):
    saved_records[step] = _record(None, "bf16")
  old = run_config.defaults()
  saved = json.loads(old.to_json())  # as the training loop writes it into the meta
  metas = _fake_reader(monkeypatch, "saved_meta")
  metas.update({0: {"config": saved}, 2: {"config": saved}, 4: OSError("torn")})
  cfg = run_config.defaults()
  cfg.seed = 7
  with pytest.raises(ValueError, match=r"differs from the config of checkpoint "
                                       rf"{re.escape(str(tmp_path))}/checkpoints/2 in \['seed'\]"):
    _check(tmp_path, cfg)
  assert _check(tmp_path) is True  # the same config resumes
  metas.update({0: {}, 2: {}})  # no checkpoint holds a config: refused, not skipped
  with pytest.raises(ValueError, match=r"config.json is missing and no checkpoint in .* holds "
                                       r"the run's config"):
    _check(tmp_path)
