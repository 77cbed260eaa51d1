"""The named policy grids: the site grid, its small part, the renamed grid refused, the
noise-matched controls."""

import pytest

from fp8jax.study.comparison import policies


def _cell(name: str) -> tuple[str, str, str]:
  module, depth, fmt = name.split("_")
  return module, depth, fmt


def test_site_grid_small_holds_one_pair_per_question():
  full = policies.site_grid(4)
  small = policies.site_grid_small(4)
  assert len(full) == 8 and len(small) == 4
  assert all(full[name] == expr for name, expr in small.items())
  cells = {_cell(n) for n in small}
  for axis, (a, b) in enumerate([("attn", "moe"), ("l0", "l0-3"), ("e4m3", "e5m2")]):
    pairs = [(c, c[:axis] + (b,) + c[axis + 1:]) for c in cells if c[axis] == a]
    assert sum(other in cells for _, other in pairs) == 1, axis


def test_grids_expand_and_the_old_name_is_refused():
  expanded = policies.expand_policies(["sites_small"], 4)
  assert [p.name for p in expanded] == ["moe_l0-3_e4m3", "moe_l0_e4m3", "attn_l0_e4m3",
                                        "moe_l0-3_e5m2"]
  for spec in ("seed", "noise(seed)"):
    with pytest.raises(ValueError, match="'seed' is now called 'sites'"):
      policies.expand_policies([spec], 4)


def test_site_controls_are_the_all_layer_e4m3_policies():
  assert policies.site_controls(policies.expand_policies(["sites_small"], 4)) == [
      "noise(moe_l0-3_e4m3)"]
  assert policies.site_controls(policies.expand_policies(["sites"], 4)) == [
      "noise(attn_l0-3_e4m3)", "noise(moe_l0-3_e4m3)"]
  assert policies.site_controls(policies.expand_policies(["formats"], 4)) == []
