"""The study end to end (fp8jax/study/pipeline.py): training, the sweep, the branches and the
report, on a copy of the tiny run of ``train_run``."""

import pytest

from fp8jax.study.branches import branch
from fp8jax.study.common import results_io
from tests.study.branches.test_branch import K


@pytest.mark.slow
def test_study_pipeline_report_answers_the_trajectory_question(train_run, tmp_path):
  """The end-to-end study with a branch stage (on a copy of the tiny run, already trained):
  the report relates the sweep to the branches."""
  import shutil  # pylint: disable=import-outside-toplevel

  from fp8jax.study import pipeline  # pylint: disable=import-outside-toplevel
  from fp8jax.study.comparison import sweep  # pylint: disable=import-outside-toplevel
  from fp8jax.train import run_config  # pylint: disable=import-outside-toplevel
  shutil.copytree(train_run, tmp_path / "train")
  path = pipeline.run_study(run_config.load_saved(train_run), tmp_path,
                            policies=["attn_l0_e4m3", "moe_l1-2_e4m3"],
                            windows=sweep.Windows(offsets=(0,), batches=1, batch_size=4),
                            branches=branch.Branches(k=K))
  text = path.read_text()
  section = text.split("## Does the one-step perturbation predict the trajectory?")[1]
  assert "Spearman" in section and "noise floor" in section.lower()
  assert "| rel_err | param_div | 6 |" in section  # 3 checkpoints x 2 policies joined
  assert (tmp_path / "compare" / "figures" / "trajectory.png").exists()
  assert len(results_io.read(tmp_path / "branch" / "branches.jsonl")) == 3 * 4
