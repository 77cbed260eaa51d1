"""The range jump at a model site (``fp8jax.study.formats.model_site``): the tiny model's
``attn_out`` follows the peaks exactly, and only delayed scaling saturates at the jump."""

import pytest

from fp8jax.study.formats import model_site


@pytest.mark.slow
def test_the_jump_saturates_the_site_under_delayed_scaling_only():
  rows = model_site.delayed_at_model_site([240.0, 240.0, 480.0], history_len=4)
  assert [(r["step"], r["scaling"]) for r in rows] == [
      (s, k) for s in range(3) for k in ("delayed", "current")]
  site = {(r["step"], r["scaling"]): r for r in rows}
  for (step, _), r in site.items():
    assert r["amax"] == pytest.approx([240.0, 240.0, 480.0][step], rel=1e-5)
    assert (r["saturated"] > 0) == (r["saturated_frac"] > 0)
  assert [site[(2, s)]["saturated"] > 0 for s in ("delayed", "current")] == [True, False]
  assert site[(1, "delayed")]["saturated"] == 0 and site[(0, "current")]["saturated"] == 0
  assert site[(2, "delayed")]["snr_db"] < site[(2, "current")]["snr_db"]
  assert site[(2, "delayed")]["logits_rel_err"] > site[(2, "current")]["logits_rel_err"]
