"""The site grid's names are looked up in its table (fp8jax.models.policy_grid), the one
that builds the sweep's grids, and parse_policy reads them through it."""

import dataclasses

import pytest

from fp8jax.models import policy as policy_lib
from fp8jax.models import policy_grid


@pytest.mark.parametrize("num_layers", [4, 9, 61])
def test_every_grid_name_looks_up_its_own_expression(num_layers):
  grids = {**policy_grid.site_grid(num_layers), **policy_grid.delayed_grid(num_layers)}
  assert len(grids) == 12 and f"moe_l0-{num_layers - 1}_e4m3_delayed" in grids
  for name, expr in grids.items():
    assert policy_grid.expression_of(name) == expr
    want = dataclasses.replace(policy_lib.parse_policy(expr), name=name)
    assert policy_lib.parse_policy(name) == want


def test_names_of_any_layer_run_and_names_that_are_no_cells():
  assert policy_grid.expression_of("moe_l1-2_e4m3") == "moe@1-2:e4m3"
  assert policy_grid.expression_of("attn_l3_e5m2_delayed") == (
      "attn@3:e5m2/delayed(h=1024,reduce=max,margin=0)")
  for name in ("bf16", "attn_l0_e4m3x", "mlp_l0_e4m3", "attn@0:e4m3", "custom", "moe_l_e4m3",
               "moe_l0-_e4m3", "moe_l0-8-9_e4m3", "moe_l\u0663_e4m3", "moe_l0_e4m3_delayedx",
               "moe_lx_e4m3", "moe_l0_e3m3"):
    assert policy_grid.expression_of(name) is None, name
  with pytest.raises(ValueError, match=r"^bad policy term 'moe_l0_e3m3' in 'moe_l0_e3m3': .*"
                                       r"site-grid name \{attn,moe\}_l<LAYERS>_\{e4m3,e5m2\}"
                                       r"\[_delayed\] \(e\.g\. moe_l0-8_e4m3\)$"):
    policy_lib.parse_policy("moe_l0_e3m3")
