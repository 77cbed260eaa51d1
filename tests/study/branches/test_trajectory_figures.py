"""The trajectory figure (fp8jax.study.branches.trajectory_figures) on a hand-built study:
its panels, points per checkpoint, noise floors, log axes and titles, and the PNG."""

import math

import pytest

from fp8jax.study.branches import trajectory, trajectory_figures
from fp8jax.study.comparison import figures

NAN = math.nan


def _pair(step, rel_err, share, param_div, loss_gap):
  return {"step": step, "policy": f"p{rel_err}", "rel_err": rel_err, "share_direct": share,
          "routing": NAN, "outcome": {"param_div": param_div, "loss_gap": loss_gap}}


STUDY = {
    "k": 16,
    "pairs": [_pair(0, 0.01, 0.5, 1e-3, 0.02), _pair(0, 0.1, 0.6, 1e-2, -0.01),
              _pair(100, 1.0, 0.7, 5e-2, 0.03), _pair(100, NAN, 0.65, 2e-2, 0.0)],
    "floors": {0: {"param_div": 5e-4, "loss_gap": 0.005},
               100: {"param_div": 1e-3, "loss_gap": 0.01}},
    "correlations": {(p, o): {"rho": 0.5, "lo": -0.05, "hi": 0.123456, "n": 3}
                     for p in trajectory.PREDICTORS for o in trajectory_figures.ROWS},
}
"""Rel_err spans two decades (a log x axis), share_direct does not; routing is all NaN (no
data); the last pair has no rel_err, so its rel_err panels show three points."""


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
  """(the PNG path, its figure): ``figures._save`` watched while the figure is drawn."""
  out = tmp_path_factory.mktemp("fig")
  seen = []
  save = figures._save
  mp = pytest.MonkeyPatch()
  mp.setattr(figures, "_save", lambda fig, *a: (seen.append(fig), save(fig, *a))[1])
  try:
    path = trajectory_figures.scatter(STUDY, out / "figures")
  finally:
    mp.undo()
  return path, seen[0], out


def _panel(fig, outcome, predictor):
  """The axes of one (outcome row, predictor column)."""
  preds = list(trajectory.PREDICTORS)
  return fig.axes[trajectory_figures.ROWS.index(outcome) * len(preds) + preds.index(predictor)]


def test_the_figure_is_a_png_named_after_the_section(drawn):
  path, _, out = drawn
  assert path == out / "figures" / "trajectory.png"
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_panel_per_outcome_and_predictor_with_labels_and_correlation(drawn):
  _, fig, _ = drawn
  assert len([ax for ax in fig.axes if ax.get_visible()]) == 2 * 3
  ax = _panel(fig, "loss_gap", "share_direct")
  assert ax.get_xlabel() == "direct share of the perturbation"
  assert ax.get_ylabel() == "K-step relative loss gap"
  assert ax.get_title() == "rho = 0.5 [-0.05, 0.123], n = 3"
  assert "K = 16 step outcomes" in fig.get_suptitle()


def test_points_are_grouped_by_checkpoint_and_non_finite_ones_left_out(drawn):
  _, fig, _ = drawn
  ax = _panel(fig, "param_div", "rel_err")
  points = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
  assert points == {"step 0": [[0.01, 1e-3], [0.1, 1e-2]], "step 100": [[1.0, 5e-2]]}
  share = _panel(fig, "loss_gap", "share_direct")
  assert {c.get_label(): len(c.get_offsets()) for c in share.collections} == {
      "step 0": 2, "step 100": 2}
  assert [t.get_text() for t in ax.get_legend().get_texts()] == ["step 0", "step 100"]
  assert share.get_legend() is None  # the first panel only


def test_a_predictor_without_data_gets_an_empty_panel(drawn):
  _, fig, _ = drawn
  for outcome in trajectory_figures.ROWS:
    ax = _panel(fig, outcome, "routing")
    assert [t.get_text() for t in ax.texts] == ["no data"]
    assert not ax.collections and not ax.get_xticks().size


def test_floors_are_lines_for_the_divergence_and_bands_for_the_loss_gap(drawn):
  _, fig, _ = drawn
  lines = _panel(fig, "param_div", "share_direct").get_lines()
  assert sorted(ln.get_ydata()[0] for ln in lines) == [5e-4, 1e-3]
  assert all(ln.get_linestyle() == "--" for ln in lines)
  bands = _panel(fig, "loss_gap", "share_direct").patches
  spans = sorted((round(p.get_path().get_extents(p.get_patch_transform()).y0, 6),
                  round(p.get_path().get_extents(p.get_patch_transform()).y1, 6))
                 for p in bands)
  assert spans == [(-0.01, 0.01), (-0.005, 0.005)]


def test_axes_spanning_a_decade_of_positive_values_are_logarithmic(drawn):
  _, fig, _ = drawn
  assert _panel(fig, "param_div", "rel_err").get_xscale() == "log"  # 0.01 .. 1
  assert _panel(fig, "param_div", "share_direct").get_xscale() == "linear"  # 0.5 .. 0.7
  assert _panel(fig, "param_div", "share_direct").get_yscale() == "log"  # 5e-4 .. 5e-2
  assert _panel(fig, "loss_gap", "share_direct").get_yscale() == "linear"  # signed
