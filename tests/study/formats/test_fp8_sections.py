"""The FP8 studies' building blocks (``fp8jax.study.formats.fp8_sections``): metrics,
inputs, schedules and the seeds' worked examples against hand-worked values, and the
delayed-vs-current study at a small size; the whole study runs in test_writeup.py."""

import numpy as np
import pytest

from fp8jax.study.formats import fp8_sections


def test_snr_db_on_hand_worked_values():
  x = np.array([1.0, 1.0])
  assert fp8_sections.snr_db(x, np.array([1.0, 0.9])) == pytest.approx(10 * np.log10(200))
  assert fp8_sections.snr_db(x, x) == float("inf")
  assert fp8_sections.snr_db(np.array([3.0, 4.0]), np.array([0.0, 0.0])) == pytest.approx(0.0)


def test_error_metrics_on_hand_worked_values():
  ref = np.array([1.0, -2.0, 4.0, 10.0])
  y = np.array([1.1, -2.0, 3.0, 10.0])  # errors 0.1, 0, 1, 0
  m = fp8_sections.error_metrics(y, ref)
  assert m["max_rel"] == pytest.approx(0.25)
  assert m["median_rel"] == pytest.approx(0.05)  # of 0.1, 0, 0.25, 0
  assert m["norm_rel"] == pytest.approx(np.sqrt(1.01) / np.sqrt(121))
  assert m["max_over_range"] == pytest.approx(0.1)
  assert 0.1 < m["p99_rel"] <= 0.25


def test_gemm_operands_follow_their_distribution():
  rng = np.random.default_rng(0)
  a, b = fp8_sections.gemm_operands("positive", 4, 300, rng)
  assert a.shape == b.shape == (4, 300) and a.min() >= 0 and b.max() < 1
  a, _ = fp8_sections.gemm_operands("outliers", 4, 300, np.random.default_rng(1))
  plain = np.random.default_rng(1).standard_normal((4, 300))  # the same first draw
  ratio = a / plain
  assert np.sum(np.all(np.isclose(ratio, 100), axis=0)) == 3  # 1% of K
  assert np.sum(np.all(ratio == 1, axis=0)) == 297
  with pytest.raises(ValueError, match=r"unknown distribution 'cauchy'; known: "
                                       r"\['gaussian', 'outliers', 'positive'\]"):
    fp8_sections.gemm_operands("cauchy", 2, 2, rng)


def test_outlier_activations_set_the_masked_elements_to_plus_minus_ratio():
  x, mask = fp8_sections.outlier_activations(64, 128, 500.0, np.random.default_rng(2),
                                             frac=0.01)
  assert x.dtype == np.float32 and x.shape == mask.shape == (64, 128)
  assert 40 < mask.sum() < 130  # ~82 of 8192
  np.testing.assert_array_equal(np.abs(x[mask]), 500.0)
  assert np.abs(x[~mask]).max() < 10


def test_range_schedule_jumps_from_240_to_480_then_960_and_repeats():
  assert fp8_sections.range_schedule(3) == [240.0] * 3
  assert fp8_sections.range_schedule(10) == [240.0, 240.0, 240.0, 480.0, 480.0, 960.0,
                                             240.0, 240.0, 240.0, 240.0]


def test_seed_example_on_hand_worked_values():
  """[2, 3, 4, 500], E4M3. One scale 448/500: 2, 3, 4 become 1.792, 2.688, 3.584, which
  round to 1.75, 2.75, 3.5. Groups of 3: scale 448/4 = 112 for [2, 3, 4]: 224 and 448 are
  on the grid, 336 is halfway between 320 and 352 and rounds to even, 320."""
  out = fp8_sections.seed_example()
  s = 448 / 500
  np.testing.assert_allclose(out["e4m3_per_tensor"], [1.75 / s, 2.75 / s, 3.5 / s, 500],
                             rtol=1e-6)
  np.testing.assert_allclose(out["e4m3_groups_of_3"], [2, 320 / 112, 4, 500], rtol=1e-6)
  # E5M2 (2 mantissa bits), one scale 57344/500: 2 -> 229.4 rounds to 224.
  assert out["e5m2_per_tensor"][0] == pytest.approx(224 / (57344 / 500), rel=1e-6)
  assert out["input"] == [2.0, 3.0, 4.0, 500.0]


def test_seed_delayed_example_saturates_the_jump_only_under_delayed_scaling():
  """History amax 240: scale 448/240, so 480 maps to 896 and clips to 448, i.e. 240."""
  out = fp8_sections.seed_delayed_example()
  assert out["delayed_saturated"] == 1
  assert out["delayed"][2] == pytest.approx(240.0, rel=1e-6)
  assert out["current"][2] == pytest.approx(480.0, rel=1e-6)
  assert max(abs(c - x) / x for c, x in zip(out["current"], out["input"])) < 1 / 16


def test_delayed_vs_current_saturates_at_the_jump():
  rows = fp8_sections.delayed_vs_current(fp8_sections.StudySizes(steps=4), history_len=4)
  assert [(r["step"], r["scaling"]) for r in rows] == [
      (s, k) for s in range(4) for k in ("delayed", "current")]
  by = {(r["step"], r["scaling"]): r for r in rows}
  assert all(by[(s, k)]["saturated"] == 0 for s in range(3) for k in ("delayed", "current"))
  # Step 3: peak 480 against a history of 240; about the half of U(-480, 480) beyond 240.
  assert 0.4 < by[(3, "delayed")]["saturated_frac"] < 0.6
  assert by[(3, "current")]["saturated"] == 0
  assert by[(3, "delayed")]["snr_db"] < by[(3, "current")]["snr_db"] - 10


def test_quick_sizes_are_smaller_than_the_defaults():
  quick, full = fp8_sections.StudySizes.quick(), fp8_sections.StudySizes()
  assert max(quick.ks) <= 4096 < max(full.ks)
  assert quick.tokens * quick.channels < full.tokens * full.channels
  assert quick.sr_keys < full.sr_keys and quick.rht_tokens < full.rht_tokens
