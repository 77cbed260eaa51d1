"""fake_quant: forward values, custom gradients, telemetry."""

from hypothesis import given
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from tests import strategies as hs
from tests.helpers import ref_for_spec
from tests.references import reference as ref


@st.composite
def _case(draw):
  shape = draw(hs.shapes(max_rank=2, max_elements=3000))
  x = draw(hs.arrays(shape, "float32", allow_nonfinite=False))
  g = draw(hs.arrays(shape, "float32", allow_nonfinite=False))
  fwd = draw(hs.specs(len(shape), formats=("e4m3", "e5m2")))
  bwd = draw(st.none() | hs.specs(len(shape), formats=("e4m3", "e5m2")))
  return x, g, fwd.replace(backward=bwd)


@pytest.mark.slow
@given(_case())
def test_forward_and_vjp_match_reference(case):
  x, g, spec = case
  y, vjp = jax.vjp(lambda v: fp8jax.fake_quant(v, spec), jnp.asarray(x))
  assert ref.same_bits(np.asarray(y), ref_for_spec(x, spec)[2])
  (dx,) = vjp(jnp.asarray(g))
  if spec.backward is None:
    assert ref.same_bits(np.asarray(dx), g), "STE must pass g unchanged"
  else:
    assert ref.same_bits(np.asarray(dx), ref_for_spec(g, spec.backward)[2])


@pytest.mark.slow
def test_straight_through_keeps_tiny_gradients():
  """A plain astype round trip would quantize a 1e-4 cotangent; STE must not."""
  x = jnp.linspace(-2.0, 2.0, 256).reshape(2, 128)
  w = jnp.full(x.shape, 1e-4) * jnp.arange(1, 257).reshape(2, 128) * 1e-3
  for name in ("current_tensor", "deepseek_v3_weight"):
    dx = jax.grad(lambda v, n=name: jnp.sum(w * fp8jax.fake_quant(v, fp8jax.preset(n))))(x)
    np.testing.assert_array_equal(dx, w)
  naive = jax.grad(lambda v: jnp.sum(
      w * v.astype(jnp.float8_e4m3fn).astype(jnp.float32)))(x)
  assert not np.array_equal(naive, w)


@pytest.mark.slow
def test_cotangent_quantization_equals_quantizing_upstream_gradient():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((4, 256)).astype(np.float32))
  upstream = jnp.asarray((rng.standard_normal((4, 256)) * 1e-3).astype(np.float32))
  spec = fp8jax.preset("deepseek_v3")
  dx = jax.grad(lambda v: jnp.sum(upstream * fp8jax.fake_quant(v, spec)))(x)
  np.testing.assert_array_equal(dx, ref_for_spec(np.asarray(upstream), spec.backward)[2])
  assert not np.array_equal(dx, upstream)


@pytest.mark.slow
def test_jit_grad_vmap_and_bf16():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((3, 2, 200)), jnp.bfloat16)
  spec = fp8jax.preset("deepseek_v3")
  loss = lambda v: jnp.sum(fp8jax.fake_quant(v, spec).astype(jnp.float32) ** 2)
  eager = jax.grad(loss)(x)
  jitted = jax.jit(jax.grad(loss))(x)
  assert eager.dtype == jnp.bfloat16
  np.testing.assert_array_equal(eager, jitted)
  per_example = jax.vmap(jax.grad(loss))(x)
  np.testing.assert_array_equal(per_example, eager)


def test_fake_quant_argument_errors():
  x = jnp.ones((2, 128))
  with pytest.raises(TypeError, match="spec must be a QuantSpec"):
    fp8jax.fake_quant(x, "deepseek_v3")
  with pytest.raises(ValueError, match="uses no delayed scaling; pass state=None"):
    fp8jax.fake_quant(x, fp8jax.preset("deepseek_v3"), fp8jax.DelayedState())
  with pytest.raises(TypeError, match="pass a DelayedState"):
    fp8jax.fake_quant(x, fp8jax.preset("te_hybrid"))


def _np_telemetry(x, spec):
  """Telemetry recomputed with NumPy from the reference quantization."""
  payload, scale_inv, deq = ref_for_spec(x, spec)
  g = spec.granularity
  block = ref.ref_block_shape(x.shape, g.kind, g.axes, g.sizes)
  inv = scale_inv.astype(np.float64)
  s = np.where(np.isnan(inv), 1.0, 1.0 / inv)  # s = 1 in a block holding NaN or inf
  s_full = s
  for axis, b in enumerate(block):
    s_full = np.repeat(s_full, b, axis=axis)
  s_full = s_full[tuple(slice(0, d) for d in x.shape)].astype(np.float32)
  finite = np.isfinite(x)
  with np.errstate(invalid="ignore", over="ignore"):
    direct = (x * s_full).astype(ref.FP8_DTYPES[spec.format]).astype(np.float32)
  saturated = ~np.isnan(x) & ~np.isfinite(direct)
  nonzero = finite & (x != 0)
  flushed = nonzero & (payload.astype(np.float32) == 0)
  xf = np.where(finite, x, 0).astype(np.float64)
  noise = np.mean(((xf - np.where(finite, deq, 0)) ** 2)[finite])
  signal = np.mean((xf ** 2)[finite])
  return dict(amax=np.max(np.abs(xf)), scale_min=s.min(), scale_max=s.max(),
              saturated_frac=saturated.mean(), underflow_frac=flushed.sum() / nonzero.sum(),
              nonfinite_frac=(~finite).mean(), signal_power=signal, noise_power=noise,
              snr_db=10 * np.log10(signal / noise))


@pytest.mark.slow
@pytest.mark.parametrize("spec", [
    fp8jax.QuantSpec(granularity=fp8jax.tile(128)),
    fp8jax.QuantSpec(format="e5m2", granularity=fp8jax.per_tensor()),
    fp8jax.QuantSpec(granularity=fp8jax.tile(32), scale_format="pow2", pow2_rounding="ceil"),
], ids=["e4m3-1x128", "e5m2-tensor", "e4m3-1x32-pow2ceil"])


def test_telemetry_matches_numpy(spec):
  rng = np.random.default_rng(2)
  x = rng.standard_normal((8, 256)).astype(np.float32)
  x[0, :5] = [900.0, 1e-9, -3e-8, np.nan, np.inf]  # an outlier, flushed tinies, non-finites
  x[3, 128:] = 0.0
  _, tel = fp8jax.fake_quant(jnp.asarray(x), spec, telemetry=True)
  expected = _np_telemetry(x, spec)
  for name, value in expected.items():
    np.testing.assert_allclose(float(getattr(tel, name)), value, rtol=1e-5, err_msg=name)
  assert float(tel.underflow_frac) > 0 and float(tel.nonfinite_frac) == 2 / x.size
  if spec.pow2_rounding == "ceil":
    assert float(tel.saturated_frac) > 1 / x.size  # ceil-rounded scales do saturate


@pytest.mark.slow
def test_telemetry_is_free_when_off_and_exact_round_trip_is_infinite_snr():
  spec = fp8jax.preset("deepseek_v3")
  x = jnp.ones((2, 128))
  off = str(jax.make_jaxpr(lambda v: fp8jax.fake_quant(v, spec))(x))
  on = str(jax.make_jaxpr(lambda v: fp8jax.fake_quant(v, spec, telemetry=True))(x))
  assert " log" not in off and " log" in on
  assert len(off) < len(on)
  _, tel = fp8jax.fake_quant(x, spec, telemetry=True)  # ones are exact in E4M3
  assert float(tel.noise_power) == 0 and float(tel.snr_db) == np.inf
