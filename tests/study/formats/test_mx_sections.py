"""The MX / NVFP4 studies' building blocks (``fp8jax.study.formats.mx_sections``): specs,
inputs, rounding steps, the Hoeffding bound, the growth exponent and the shared-block
fraction, on hand-worked cases; the whole studies run in tests/study/formats/test_writeup.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.study.formats import fp8_sections, mx_sections

_qd = jax.jit(fp8jax.quantize_dequantize, static_argnums=1)
_draws = jax.jit(lambda x, keys, spec: jax.vmap(
    lambda k: fp8jax.quantize_dequantize(x, spec, key=k))(keys), static_argnums=2)


@pytest.mark.slow
def test_stochastic_rounding_on_a_constructed_input():
  """Blocks [6, 1.15 x 15] have scale 1: 1.15 lies 0.3 steps above the grid point 1."""
  x = np.full((4, 32), 1.15, np.float32)
  x[:, ::16] = 6.0
  n = 2000
  keys = jax.random.split(jax.random.key(3), n)
  for name in ("nvfp4", "mxfp4_rceil"):
    spec = mx_sections.spec_of(name)
    step, ok = mx_sections.rounding_step(x, spec)
    small = x < 6
    np.testing.assert_allclose(step[small], 0.5)
    assert ok.all()
    rn = np.asarray(_qd(jnp.asarray(x), spec), np.float64)
    np.testing.assert_allclose(rn[small], 1.0)  # bias -0.3 steps everywhere
    draws = _draws(jnp.asarray(x), keys, spec.replace(rounding="stochastic"))
    bias = np.mean(np.asarray(draws, np.float64), axis=0) - x
    bound = mx_sections.hoeffding_steps(n, x.size, delta=1e-6)
    assert bound < 0.1
    assert np.max(np.abs(bias) / step) <= bound, name


@pytest.mark.slow
def test_rounding_step_is_the_grid_spacing_round_to_nearest_sees():
  x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
  for name in ("nvfp4", "mxfp4", "mxfp4_rceil", "mxfp6_e2m3"):
    spec = mx_sections.spec_of(name)
    step, ok = mx_sections.rounding_step(x, spec)
    err = np.abs(np.asarray(_qd(jnp.asarray(x), spec), np.float64) - x)
    ratio = err[ok] / step[ok]
    assert ratio.max() <= 0.5 + 1e-6 and ratio.max() > 0.45, name  # half a step, not less




def test_spec_of_drops_the_cotangent_spec_and_applies_changes():
  spec = mx_sections.spec_of("deepseek_v3", margin=2)
  assert spec.backward is None and spec.margin == 2
  assert spec.granularity == fp8jax.preset("deepseek_v3").granularity


def test_sr_specs_pair_each_format_with_its_stochastic_rounding():
  specs = mx_sections.sr_specs()
  assert set(specs) == {(f, r) for f in ("nvfp4", "mxfp4", "mxfp4_rceil")
                        for r in ("nearest", "stochastic")}
  for name in mx_sections.SR_FORMATS:
    assert specs[(name, "nearest")].rounding == "nearest"
    assert specs[(name, "stochastic")].rounding == "stochastic"
    assert specs[(name, "stochastic")].fmt.name == specs[(name, "nearest")].fmt.name == "e2m1"
  assert specs[("nvfp4", "stochastic")].sr_bits == 24  # not the preset's hardware 8 bits


def test_channel_outliers_marks_one_percent_of_the_channels():
  x, mask = mx_sections.channel_outliers(16, 300, np.random.default_rng(0))
  assert x.shape == (16, 300) and x.dtype == np.float64
  assert mask.shape == (300,) and mask.sum() == 3
  assert mx_sections.channel_outliers(4, 64, np.random.default_rng(0))[1].sum() == 1  # >= 1
  assert mx_sections.channel_outliers(4, 64, np.random.default_rng(0), frac=0.25)[1].sum() == 16


def test_shared_fraction_counts_ordinary_channels_in_a_block_with_an_outlier():
  mask = np.zeros(10, bool)
  mask[[1, 9]] = True  # blocks of 4: [0-3] and [8-9 + padding] hold outliers
  assert mx_sections._shared(mask, 4) == 0.5  # channels 0, 2, 3 and 8 of the 8 ordinary
  assert mx_sections._shared(mask, 16) == 1.0
  assert mx_sections._shared(mask, 1) == 0.0
  assert mx_sections._shared(np.ones(4, bool), 2) == 0.0  # no ordinary channel


def test_hoeffding_bound_on_hand_worked_cases():
  # log(2 n / delta) = 2 when delta = 2 n / e**2: t = sqrt(2 / (2 draws)) = 1 / sqrt(draws).
  assert mx_sections.hoeffding_steps(4, 1, delta=2 / math.e**2) == pytest.approx(0.5)
  assert mx_sections.hoeffding_steps(100, 5, delta=10 / math.e**2) == pytest.approx(0.1)
  # More elements or a smaller delta need a larger bound; more draws a smaller one.
  assert mx_sections.hoeffding_steps(64, 1000) > mx_sections.hoeffding_steps(64, 10)
  assert mx_sections.hoeffding_steps(256, 10) < mx_sections.hoeffding_steps(64, 10)


def test_sum_inputs_draw_each_distribution():
  rng = np.random.default_rng(1)
  z = mx_sections.sum_inputs("zero-mean", 8, 4096, rng)
  assert z.shape == (8, 4096) and z.dtype == np.float32 and abs(z.mean()) < 0.05
  narrow = mx_sections.sum_inputs("narrow positive", 8, 4096, rng)
  assert narrow.min() > 0.4 and abs(narrow.mean() - 1) < 0.01
  log_normal = mx_sections.sum_inputs("log-normal", 8, 4096, rng)
  assert log_normal.min() > 0 and abs(np.log(log_normal).std() - 1) < 0.05
  with pytest.raises(ValueError, match=r"unknown distribution 'uniform'; known: "
                                       r"\['log-normal', 'narrow positive', 'zero-mean'\]"):
    mx_sections.sum_inputs("uniform", 2, 2, rng)


def test_growth_exponent_is_the_slope_in_log_log_over_matching_rows():
  rows = [{"format": "a", "k": k, "rms": 3.0 * k**0.5} for k in (16, 256, 4096)]
  rows += [{"format": "b", "k": k, "rms": 0.01 * k} for k in (16, 256, 4096)]
  assert mx_sections.growth_exponent(rows, format="a") == pytest.approx(0.5)
  assert mx_sections.growth_exponent(rows, format="b") == pytest.approx(1.0)


def test_wgrad_operands_mark_one_in_64_tokens():
  x, mask, dy = mx_sections.wgrad_operands(256, np.random.default_rng(2))
  assert x.shape == dy.shape == (256, 128)
  assert x.dtype == np.float64 and dy.dtype == np.float32
  assert mask.shape == (256,) and mask.sum() == 4
  assert mx_sections.wgrad_operands(32, np.random.default_rng(2))[1].sum() == 1


@pytest.mark.slow
def test_format_outlier_snr_rows_on_a_small_tensor():
  """One outlier channel of 64: the shared fraction is the block width's, hand-counted."""
  sizes = fp8_sections.StudySizes(tokens=8, channels=64, format_ratios=(1, 1024))
  rows = {(r["format"], r["outlier_ratio"]): r for r in mx_sections.format_outlier_snr(sizes)}
  assert len(rows) == 2 * len(mx_sections.FORMATS)
  widths = {"nvfp4": 16, "mxfp4": 32, "mxfp8": 32, "fp8 per-tensor": 64}
  for name, width in widths.items():
    assert rows[(name, 1024.0)]["bulk_shared_frac"] == pytest.approx((width - 1) / 63), name
  # E4M3 (3 mantissa bits) keeps ~30 dB, E2M1 (1 bit) far less; the round-up scale rule
  # never saturates, the OCP rule does.
  for r in (1.0, 1024.0):
    assert rows[("mxfp8", r)]["bulk_snr_db"] > 25
    assert rows[("mxfp4", r)]["bulk_snr_db"] < rows[("mxfp8", r)]["bulk_snr_db"] - 8
    assert rows[("mxfp4_rceil", r)]["saturated_frac"] == 0
  assert rows[("mxfp8_ocp", 1024.0)]["saturated_frac"] > 0
